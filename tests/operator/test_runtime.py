"""The operator's runtime (`kubesweep.operator.runtime`): the supervisor that steps sweeps."""

from __future__ import annotations


def test_the_supervisor_steps_a_sweep_without_task_whose_jobs_wait_on_the_finalizer() -> None:
    import asyncio

    from kubesweep.operator.runtime import Supervisor

    steps: list[tuple[str, str]] = []
    leader = [False]

    async def run() -> None:
        sup = Supervisor(lambda ns, name: steps.append((ns, name)), is_leader=lambda: leader[0], resync=60,
                         debounce=0)
        sup.orphaned("ns", "gone")  # a standby only remembers it
        await asyncio.sleep(0.05)
        assert steps == [] and sup.orphans == {("ns", "gone")}
        leader[0] = True
        sup.wake_all()  # gaining the Lease: one step, then it is forgotten
        await asyncio.sleep(0.1)
        assert steps == [("ns", "gone")] and not sup.orphans
        sup.notice("ns", "deleted", deleted=True)  # a deleted Sweep gets one more step
        await asyncio.sleep(0.1)
        assert steps[-1] == ("ns", "deleted") and not sup.orphans
        await sup.stop()

    asyncio.run(run())
