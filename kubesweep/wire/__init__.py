"""The contract floor: what the job, the backends, the operator and the reports agree on, with nothing of theirs.

Every module here imports only the standard library, pydantic and other modules of this package; every other
part of kubesweep may import it, and it imports none of them (tests/test_imports.py holds that).
"""
