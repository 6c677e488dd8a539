"""`python -m kubesweep.jobs`: run one trial (see kubesweep/jobs/cli.py)."""

import sys

from kubesweep.jobs.cli import main

sys.exit(main())
