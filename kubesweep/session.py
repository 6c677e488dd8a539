"""The session layer: what a `sweep` command does with a sweep, between parsing its arguments and printing.

A `Session` holds one command's backend and tracking options and makes its backend once (`Session.backend`,
the only backend factory the CLI uses). It submits, follows, resumes and cancels sweeps, detaches them
(`kubesweep.detach`), opens and finishes the sweep's MLflow parent run, runs a search where one runs in this
process (`kubesweep.tune.dispatch.run_search`), and reads a sweep's results back. It prints nothing: messages go
to `notify(text, warning)`, progress to the callback the caller passes, outcomes come back as values, and
errors are exceptions (`BackendError`, `SpecError`, `TrackingError`) that `error_code` maps to an exit code.

    session = Session(Options(backend="local", home=home), notify=show)
    if session.submit(sweep, plan) is None:     # a search that runs here
        ended = session.run_search(sweep, progress=view.update)
    else:
        ended = session.follow(sweep.name, progress=view.update)
    sys.exit(ended.code)
"""

from __future__ import annotations

import difflib
import json
import os
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from kubesweep.backend_factory import DEFAULT_BACKEND, BackendConfig, Flags, configure, make_backend
from kubesweep.backends.base import (
    AmbiguousTrial,
    Backend,
    BackendError,
    Phase,
    ProgressCallback,
    SweepConflict,
    SweepNotFound,
    SweepStatus,
    TrialStatus,
)
from kubesweep.backends.k8s_client import Api, require_configuration
from kubesweep.backends.k8s_gpus import NodesHidden, read_cluster_gpus, read_queue_flavors
from kubesweep.backends.local_machine import default_home
from kubesweep.detach import spawn_driver, spawn_search
from kubesweep.gpus import CatalogError
from kubesweep.plan import Plan
from kubesweep.preflight import TypeFit, check, gpu_fit
from kubesweep.sweep_spec import SpecError, Sweep
from kubesweep.tracking.aggregate import Cell, aggregate
from kubesweep.tracking.records import from_backend, from_results_dir, names_a_directory
from kubesweep.tracking.runs import SweepRuns, TrackingError, UnusableStore
from kubesweep.tracking.sweep import Loaded, finish_parent, kill_running, load_records, open_parent
from kubesweep.tracking.target import TrackingTarget, resolve, sqlite_experiments
from kubesweep.tracking.view import runs_url
from kubesweep.tune.dispatch import run_search, summary_names, summary_of
from kubesweep.wire.env import TrackingEnv
from kubesweep.wire.search import RepeatsSummary, SearchSummary, SummaryError, read_summary
from kubesweep.wire.trial_metrics import DEFAULT_TARGET_ACCURACY

# Exit codes of `sweep` (and of the tuner, `python -m kubesweep.tune`)
EXIT_OK, EXIT_TRIALS_FAILED, EXIT_USAGE, EXIT_NOT_FOUND, EXIT_BACKEND, EXIT_INTERRUPTED = 0, 1, 2, 3, 4, 130
EXIT_CANCELLED = 5  # the sweep ended, some of its trials cancelled (and none failed): not a success

Notify = Callable[[str, bool], None]  # (message, warning): a warning goes to stderr


def exit_code(status: SweepStatus) -> int:
    """The exit code of an ended sweep: 1 when a trial failed, else 5 when a trial was cancelled (by `sweep
    cancel`, from this shell or another), else 0 (OOM and GPU-mismatch cells are results)."""
    if status.has_failures:
        return EXIT_TRIALS_FAILED
    return EXIT_CANCELLED if any(t.phase == Phase.CANCELLED for t in status.trials) else EXIT_OK


def error_code(exc: BaseException) -> int | None:
    """The exit code that reports `exc`: 2 for bad input (an invalid spec or GPU catalog, an ambiguous trial
    reference, a sqlite MLflow store file that cannot be read, a sweep name taken by another spec, a stored search
    summary of the wrong shape), 3 for a sweep
    or trial not found, 4 for a backend or tracking server that failed; None for anything else."""
    if isinstance(exc, AmbiguousTrial | SpecError | CatalogError | UnusableStore | SweepConflict | SummaryError):
        return EXIT_USAGE
    if isinstance(exc, SweepNotFound):
        return EXIT_NOT_FOUND
    if isinstance(exc, BackendError | TrackingError):
        return EXIT_BACKEND
    return None


@dataclass(frozen=True)
class Options:
    """Where a command's sweeps run and are tracked (the CLI's backend and tracking flags)."""

    backend: str = DEFAULT_BACKEND
    home: Path | None = None  # local state directory (default ~/.kubesweep, $KUBESWEEP_HOME)
    namespace: str | None = None
    kubeconfig: Path | None = None
    direct: bool = False  # kubernetes: drive the Jobs from this process, not through the operator
    any_gpu: bool = False  # local: run trials on whatever GPU is here
    parallel: int = 1  # local: CPU-only trials at once
    tracking_uri: str | None = None
    no_tracking: bool = False
    allow_unpinned: bool = False  # kubernetes: accept a job image by tag, not pinned by digest

    @property
    def home_dir(self) -> Path:
        return (self.home or default_home()).expanduser()

    @cached_property
    def config(self) -> BackendConfig:
        """The backend's typed configuration (`backend_factory`): what it is made from, and what it declares."""
        return configure(self.backend, Flags(home=self.home, namespace=self.namespace, kubeconfig=self.kubeconfig,
                                             direct=self.direct, any_gpu=self.any_gpu, parallel=self.parallel,
                                             allow_unpinned=self.allow_unpinned))


@dataclass
class Ended:
    """A sweep followed to its end: its status, the command's exit code and, for a search, what it found."""

    status: SweepStatus
    code: int
    found: SearchSummary | None = None


@dataclass
class Results:
    """A sweep's results, aggregated (`kubesweep.tracking.aggregate`), and where they were read from."""

    cells: list[Any]
    loaded: Loaded
    target: TrackingTarget
    sweep: Sweep | None  # the sweep as the backend keeps it (None: unknown here)
    searched: bool  # the sweep is a search, or may be one (its spec is unknown here)
    target_accuracy: float = DEFAULT_TARGET_ACCURACY  # what time-to-accuracy was measured to


def _read_summary(path: Path, where: str | None = None) -> SearchSummary | None:
    """The search summary in the file at `path` (`where` names it in an error, else the path); None when it cannot
    be read or is not JSON (a file being written, a partial download). A summary of another shape raises
    `SummaryError`, one line naming the file and the field."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return None
    return read_summary(data, where or str(path))


def _tta(sweep: Sweep | None) -> float:
    """The accuracy time to accuracy is measured to for `sweep`: its spec's, else the default (a sweep unknown here)."""
    return sweep.spec.tta_target if sweep is not None else DEFAULT_TARGET_ACCURACY


def _quiet(message: str, warning: bool) -> None:
    pass


def _continuing(unfinished: list[TrialStatus]) -> list[str]:
    """What `resume` does with the trials that have not ended: `continuing 2 not yet run, 1 still running`."""
    if not unfinished:
        return []
    running = Counter(t.phase.value == "Running" for t in unfinished)
    parts = [f"{running[False]} not yet run"] if running[False] else []
    parts += [f"{running[True]} still running (followed to its end, not run again)"] if running[True] else []
    return [f"continuing {', '.join(parts)}"]


def _tally(trials: list[TrialStatus], *, rerun: bool = False) -> str:
    """`2 succeeded, 1 oom`: trials by outcome. Among trials to rerun, a succeeded one is there because its
    results file is missing: `1 results missing`."""
    def word(t: TrialStatus) -> str:
        if rerun and t.phase.value == "Succeeded":
            return "results missing"
        return t.outcome.value if t.outcome is not None else t.phase.value.lower()

    return ", ".join(f"{n} {w}" for w, n in Counter(word(t) for t in trials).items())


class Session:
    """One command's work on sweeps: one backend, made on first use, and the sweep's tracking once opened."""

    def __init__(self, options: Options, notify: Notify = _quiet):
        self.options = options
        self.notify = notify
        self._backend: Backend | None = None
        self.target: TrackingTarget | None = None  # set by open_tracking
        self.tracking: TrackingEnv | None = None  # the parent run's env for the trials (None: not tracked)
        self._checked: Plan | None = None  # the plan `check` passed last
        self._ended_read: dict[str, Loaded] = {}  # an ended sweep's trials as read for its answer, for its summary

    # -- the backend ------------------------------------------------------------------------------------

    @property
    def backend(self) -> Backend:
        """The backend, made on first use (with the tracking env, when tracking was opened first)."""
        if self._backend is None:
            self._backend = make_backend(self.options.config, self.tracking)
        return self._backend

    def searches(self, name: str, *, unknown: bool) -> bool:
        """The sweep `name` is a search (its trials are made while it runs); `unknown` when the backend does not
        know it. A stored spec that no longer validates may be a search's."""
        try:
            sweep = self.backend.sweep_of(name)
        except SpecError:
            return True
        return sweep.spec.adaptive if sweep is not None else unknown

    def search_runs_here(self, sweep: Sweep) -> bool:
        """The sweep's search runs in this process (`run_search`) where whoever waits on a sweep drives it (local,
        --direct); otherwise the operator's tuner Job runs it."""
        return sweep.spec.adaptive and self.options.config.kind().driven_by_waiter

    def search_storage(self, name: str) -> Path:
        """Where a search keeps its state (Ray Tune's experiment, the max-batch bisection): under the sweep's
        local directory, or $KUBESWEEP_TUNE_STORAGE/<sweep>."""
        root = os.environ.get("KUBESWEEP_TUNE_STORAGE")
        return Path(root) / name if root else self.options.home_dir / "sweeps" / name / "search"

    # -- tracking ---------------------------------------------------------------------------------------

    def tracking_target(self, name: str, sweep: Sweep | None, *, experiment: str | None = None,
                        disabled: bool | None = None) -> TrackingTarget:
        """Where the sweep is tracked: flag, env, spec, else the local store (kubesweep.tracking.target)."""
        tracking = sweep.spec.tracking if sweep is not None else None
        return resolve(experiment=experiment or (tracking.experiment if tracking else None) or name,
                       home=self.options.home_dir, flag=self.options.tracking_uri,
                       spec_uri=tracking.uri if tracking else None, backend=self.options.backend,
                       runs_here=self.options.config.kind().runs_here,
                       disabled=self.options.no_tracking if disabled is None else disabled)

    def recorded_views(self, name: str) -> tuple[str, str] | None:
        """The runs view of the sweep and its parent run's page (the answer in full) on the tracking server the
        options name, from the parent run the backend records for it (the operator's, on a cluster); None where
        it records none. Raises TrackingError when that server does not give the run."""
        parent = self.backend.parent_run_id(name)
        target = self.tracking_target(name, None)
        if parent is None or target.uri is None:
            return None
        experiment_id = SweepRuns(target, name).experiment_of(parent)
        base = target.uri.rstrip("/")
        return runs_url(base, experiment_id), f"{base}/#/experiments/{experiment_id}/runs/{parent}"

    def open_tracking(self, sweep: Sweep, trials: int) -> TrackingEnv | None:
        """Find or create the sweep's parent run (said through `notify`); off is not an error. A backend made
        already starts its trials with the new env from now on."""
        target = self.tracking_target(sweep.name, sweep)
        if self._backend is not None and self._backend.opens_parent_run:
            # the operator opens the parent run, owns it and keeps its record: one opened here would be a second,
            # which no trial logs under and which a later `sweep results` could take for the sweep's
            self.notify(f"tracking: the operator opens the sweep's MLflow parent run and keeps its record; "
                        f"`sweep status {sweep.name}` names it", False)
            self.target, self.tracking = target, None
            return None
        opened = open_parent(target, sweep.name, backend=self.options.backend, trials=trials,
                             spec=sweep.to_document())
        self.notify(opened.message, opened.warning)
        if opened.env is None and self.options.config.kind().runs_here:
            # local trials inherit this environment: keep them from logging when tracking is off
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        self.target, self.tracking = target, opened.env
        if self._backend is not None:
            self._backend.use_tracking(sweep.name, opened.env)
        return opened.env

    def _ended(self, name: str, status: SweepStatus, found: SearchSummary | None = None) -> Ended:
        code = exit_code(status)
        if self.target is not None:
            to = self.tta_target(name)
            finish_parent(self.tracking, self.target, name, failed=code != EXIT_OK,
                          cells=self._answer_cells(name, to), target_accuracy=to)
        return Ended(status, code, found)

    def tta_target(self, name: str) -> float:
        """The dev accuracy the sweep's time to accuracy is measured to: its spec's `target_accuracy`, else 0.9."""
        try:
            sweep = self.backend.sweep_of(name)
        except (BackendError, SpecError):
            sweep = None
        return _tta(sweep)

    def ended_records(self, name: str) -> Loaded:
        """The trials of a sweep that has just ended, for the summary `submit` and `resume` print: the backend's
        own results files where it keeps them on this machine, else the sweep's MLflow runs (a cluster's trials
        write their figures there alone), else the backend's status (outcomes without figures, the note says
        why)."""
        if name in self._ended_read:  # read once already, for the answer its parent run carries
            return self._ended_read[name]
        if self.target is not None and self.target.enabled:
            try:
                return load_records(self.target, name, self.backend)
            except (BackendError, TrackingError) as exc:
                note = f"MLflow could not be read: {exc}; trials' outcomes only, no figures"
        else:
            note = "" if self.backend.keeps_results else (
                f"tracking is off and the {self.backend.name} backend keeps no results files on this machine: "
                "trials' outcomes only, no figures")
        return Loaded(from_backend(self.backend, name), f"results files ({self.backend.name} backend)", note)

    def _answer_cells(self, name: str, target_accuracy: float) -> list[Cell] | None:
        """The ended sweep's cells, for the answer its parent run carries (None where they cannot be read: the
        parent run then ends without it)."""
        if self.tracking is None or self.target is None:
            return None
        try:
            self._ended_read[name] = load_records(self.target, name, self.backend)
        except (BackendError, TrackingError):
            return None
        return aggregate(self._ended_read[name].records, target=target_accuracy)

    # -- a sweep's life ---------------------------------------------------------------------------------

    def check(self, plan: Plan, *, cluster: bool = False) -> None:
        """What this session's backend needs of the plan before anything of it runs (`kubesweep.preflight`): raises
        `NotRunnable` (exit 2) with every problem. `submit` runs it first, with `cluster`: a Kubernetes backend
        with no cluster configured says so (`BackendError`) before what the spec lacks for one (its image); `sweep
        validate` runs it alone, for a cluster it need not reach."""
        o = self.options
        check(plan, o.backend, any_gpu=o.any_gpu, allow_unpinned=o.allow_unpinned,
              reach=(lambda: require_configuration(o.kubeconfig)) if cluster else None)
        asks = cluster or self._backend is not None or not o.config.asks_cluster  # validate asks no cluster
        if asks and (conflict := self.backend.conflict(plan.sweep)) is not None:
            raise conflict
        self._checked = plan

    def cluster_fit(self, plan: Plan) -> list[TypeFit] | None:
        """The plan's GPU trials split by what the cluster's nodes offer (`preflight.gpu_fit`), before anything
        is applied. None where this user may not list the cluster's nodes: said in one line (`notify`), and the
        caller goes on. An API server that cannot be reached is the `BackendError` every request gives."""
        o = self.options
        api = Api.connect(o.namespace, o.kubeconfig)
        try:
            cluster = read_cluster_gpus(api)
        except NodesHidden as exc:
            self.notify(f"note: the cluster's GPU types are not checked: this user may not list its nodes ({exc}); "
                        f"trials of a type it has no node of end `unschedulable` after "
                        f"{plan.sweep.spec.resources.unschedulable_seconds:,} s", True)
            return None
        queue = plan.sweep.spec.queue
        if queue:
            try:
                cluster = replace(cluster, queue=read_queue_flavors(api, queue))
            except BackendError as exc:  # NodesHidden too: a ClusterQueue this user may not read
                self.notify(f"note: the GPU types Kueue queue {queue!r} admits are not checked: {exc}", True)
        return gpu_fit(plan, cluster)

    def submit(self, sweep: Sweep, plan: Plan) -> SweepStatus | None:
        """Check the plan (`check`: a problem leaves no state behind), open the sweep's tracking and start its
        trials (submitting the same spec again starts nothing twice). None when its search runs in this process:
        `run_search` makes and runs the trials."""
        if self._checked is not plan:
            self.check(plan)
        if self.options.config.asks_cluster:  # ask the cluster first: an unreachable one is said before anything
            self.backend.sweep_of(sweep.name)  # else, and no parent run is opened for a sweep it cannot take
        self.open_tracking(sweep, len(plan.trials))
        backend = self.backend  # made with the parent run's env
        if self.search_runs_here(sweep):
            return None
        return backend.submit(plan)

    def resume(self, name: str) -> tuple[Sweep, SweepStatus | None]:
        """Open the sweep's tracking again and rerun its failed, cancelled and missing trials, saying how many
        (`notify`). (The sweep, None) when its search runs in this process: `run_search` continues it from its
        saved state. A sweep whose every trial has ended with an answer is left as it is, tracking included,
        and comes back done: nothing to rerun."""
        sweep = self.backend.sweep_of(name)
        if sweep is None:
            raise SweepNotFound(f"no {self.options.backend} sweep named {name!r}")
        before = self.backend.status(name)
        rerun = self.backend.to_rerun(before)
        unfinished = [t for t in before.trials if not t.phase.terminal]
        if not sweep.spec.adaptive and not rerun and not unfinished:
            self.notify(f"sweep {name!r}: nothing to rerun: every trial has ended with an answer "
                        f"({_tally(before.trials)})", False)
            return sweep, before
        self.open_tracking(sweep, len(before.trials))
        if self.search_runs_here(sweep):
            return sweep, None
        if rerun or unfinished:
            what = [f"rerunning {len(rerun)} of {len(before.trials)} trials ({_tally(rerun, rerun=True)})"] if \
                rerun else ["no failed or cancelled trial to rerun"]
            self.notify(f"sweep {name!r}: {'; '.join(what + _continuing(unfinished))}", False)
        return sweep, self.backend.resume(name)

    def follow(self, name: str, progress: ProgressCallback | None = None) -> Ended:
        """Wait until every trial has ended (for the local backend, this process drives the sweep meanwhile),
        then finish the sweep's parent run."""
        return self._ended(name, self.backend.wait(name, progress=progress))

    def run_search(self, sweep: Sweep, progress: ProgressCallback | None = None) -> Ended:
        """Run (or continue) the sweep's search to its end, then finish its parent run; `found` says what it
        found."""
        found = run_search(sweep, self.backend, storage=self.search_storage(sweep.name), tracking=self.tracking,
                           progress=progress)
        return self._ended(sweep.name, self.backend.status(sweep.name), found)

    def detach(self, name: str) -> Path | None:
        """Leave the sweep to run without this process. A sweep driven by whoever waits on it (local; Kubernetes
        with `--direct`) gets a driver process of its own: its log. None where the operator drives it."""
        if not self.backend.driven_by_waiter:
            return None
        o = self.options
        return spawn_driver(name, o.home, backend=o.backend, namespace=o.namespace, kubeconfig=o.kubeconfig,
                            tracking_uri=o.tracking_uri, no_tracking=o.no_tracking)

    def drive(self, name: str) -> Ended:
        """A detached driver's work (`sweep _drive`): drive the sweep to its end, then finish its parent run. A
        backend that keeps no tracking env with the sweep (Kubernetes) finds the sweep's parent run again first,
        as `sweep resume` does, so the trials it starts log under it."""
        if not self.backend.remembers_tracking:
            sweep = self.backend.sweep_of(name)
            if sweep is None:
                raise SweepNotFound(f"no {self.options.backend} sweep named {name!r}")
            self.open_tracking(sweep, len(self.backend.status(name).trials))
        return self.follow(name)

    def detach_search(self, file: Path, name: str, *, allow_unpinned: bool, max_trials: int,
                      sets: Sequence[str] = ()) -> Path:
        """Run the search of the spec `file` (with the `--set` overrides `sets`) in a process of its own; its log
        file."""
        o = self.options
        return spawn_search(file, name, home=o.home, backend=o.backend, parallel=o.parallel, max_trials=max_trials,
                            allow_unpinned=allow_unpinned, any_gpu=o.any_gpu, tracking_uri=o.tracking_uri,
                            no_tracking=o.no_tracking, namespace=o.namespace, kubeconfig=o.kubeconfig,
                            direct=o.direct, sets=sets)

    def delete(self, name: str) -> int:
        """Stop the sweep's trials and forget it; the MLflow runs it left running (its parent run, the trials'
        runs) end as KILLED, so none stays RUNNING for ever. Returns how many runs were ended so. A sweep whose
        parent run the operator owns has its runs ended by the operator, not here."""
        sweep = self.backend.sweep_of(name)
        self.backend.delete(name)
        if self.backend.opens_parent_run:
            return 0
        target = self.tracking_target(name, sweep)
        if not target.enabled:
            return 0
        try:
            return kill_running(SweepRuns(target, name))
        except TrackingError as exc:
            self.notify(f"note: the sweep's MLflow runs were not ended: {exc}", True)
            return 0

    def cancel(self, name: str) -> tuple[bool, SweepStatus]:
        """Stop the sweep's running trials and start no new ones: (True, its status after). (False, its status)
        when it has already ended; a search's sweep may still make trials, so it is cancelled all the same."""
        before = self.backend.status(name)
        if before.done and before.trials and not self.searches(name, unknown=False):
            return False, before
        return True, self.backend.cancel(name)

    # -- results ----------------------------------------------------------------------------------------

    def results(self, name: str, *, experiment: str | None, target_accuracy: float | None, best_by: str,
                source: str = "auto") -> Results:
        """The sweep's trials aggregated over repeats: from the backend's results files or MLflow
        (`kubesweep.tracking.sweep.load_records`). A backend that cannot be made is a note: MLflow may still
        know the sweep. Time to accuracy is to `target_accuracy`, else the spec's `target_accuracy`, else 0.9."""
        backend: Backend | None
        sweep: Sweep | None = None
        try:
            backend = self.backend
        except BackendError as exc:
            self.notify(f"note: {exc}", True)
            backend = None
        if backend is not None:
            try:
                sweep = backend.sweep_of(name)
            except SpecError:
                sweep = None
        target = self.tracking_target(name, sweep, experiment=experiment)
        if sweep is None and backend is not None and source != "files":
            self.known_somewhere(name, backend, target)
        loaded = load_records(target, name, backend, source=source)
        if loaded.note:
            self.notify(f"note: {loaded.note}", True)
        to = target_accuracy if target_accuracy is not None else _tta(sweep)
        cells = aggregate(loaded.records, target=to, best_by=best_by)
        searched = sweep is None or sweep.spec.adaptive  # a sweep not known here may be a search
        return Results(cells, loaded, target, sweep, searched, to)

    def known_somewhere(self, name: str, backend: Backend, target: TrackingTarget) -> None:
        """`SweepNotFound` at once, nearest names first, for a sweep neither the backend nor a local MLflow store
        knows: said without opening the store through MLflow (seconds) and without creating it. Where the store
        cannot be read so (a server), nothing is decided here."""
        experiments = sqlite_experiments(target.uri) if target.enabled else None
        if experiments is None or target.experiment in experiments:
            return
        sweeps = backend.list_sweeps()
        near = difflib.get_close_matches(name, list(dict.fromkeys([*sweeps, *experiments])), n=3, cutoff=0.6)
        hint = f"; did you mean {' or '.join(repr(n) for n in near)}?" if near else (
            f"; known: {', '.join(sweeps[:10])}" if sweeps else "")
        raise SweepNotFound(f"no {self.options.backend} sweep named {name!r}, and no MLflow experiment "
                            f"{target.experiment!r} in {target.uri}{hint}")

    def merged_results(self, names: list[str], *, experiment: str | None, target_accuracy: float | None,
                       best_by: str, source: str = "auto") -> Results:
        """Several sweeps' trials in one comparison: each NAME a sweep of this session's backend and tracking, or a
        directory of results files (another machine's sweep, copied here). Trials meet in one cell when they ran
        the same settings on the same GPU type. One name: `results`. Time to accuracy is to `target_accuracy`,
        else the first named sweep's own target (a directory has no spec), else 0.9."""
        if len(names) == 1 and not names_a_directory(names[0]):
            return self.results(names[0], experiment=experiment, target_accuracy=target_accuracy, best_by=best_by,
                                source=source)
        parts: list[Loaded] = []
        first: Results | None = None
        for name in names:
            if names_a_directory(name):
                records = from_results_dir(Path(name), skipped=lambda line: self.notify(f"warning: {line}", True))
                parts.append(Loaded(records, f"results files under {name}", ""))
                continue
            one = self.results(name, experiment=experiment, target_accuracy=target_accuracy, best_by=best_by,
                               source=source)
            first = first or one
            parts.append(one.loaded)
        records = [r for part in parts for r in part.records]
        loaded = Loaded(records, "; ".join(p.source for p in parts), "",
                        first.loaded.parent_run_id if first is not None else None)
        to = target_accuracy if target_accuracy is not None else \
            first.target_accuracy if first is not None else DEFAULT_TARGET_ACCURACY
        cells = aggregate(records, target=to, best_by=best_by)
        return Results(cells, loaded, first.target if first is not None else self.tracking_target(names[0], None),
                       None, False, to)

    def repeats_spent(self, names: list[str]) -> list[tuple[str, RepeatsSummary]]:
        """What sequential repeats spent in each of `names` that ran under the rule: (name, its `repeats.json`),
        from a sweep's search storage or parent run, or from `search/repeats.json` of a directory of results files
        (a local sweep's directory copied from another machine). A `repeats.json` of another shape is bad input
        (`SummaryError`)."""
        out = []
        for name in names:
            found: SearchSummary | None = None
            if names_a_directory(name):
                path = Path(name).expanduser() / "search" / "repeats.json"
                found = _read_summary(path)
            else:
                try:
                    sweep = self.backend.sweep_of(name)
                except (BackendError, SpecError):
                    sweep = None
                if sweep is not None and sweep.spec.repeat_rule is not None:
                    found = self.search_found(name, sweep, None)
            if isinstance(found, RepeatsSummary):
                out.append((name, found))
        return out

    def search_found(self, name: str, sweep: Sweep | None, parent_run_id: str | None) -> SearchSummary | None:
        """What a search found: its file under the search storage, else the parent run's artifact in MLflow
        (`<strategy>/<strategy>.json`); any strategy's when the sweep is not known here. A file that is not JSON or
        cannot be read is passed over; one of another shape is bad input (`SummaryError`)."""
        names = summary_names(summary_of(sweep) if sweep is not None else None)
        storage = self.search_storage(name)
        for _, file in names:
            if (found := _read_summary(storage / file)) is not None:
                return found
        if parent_run_id is None:
            return None
        runs = SweepRuns(self.tracking_target(name, None, disabled=False), name)
        for folder, file in names:
            with tempfile.TemporaryDirectory(prefix="kubesweep-search-") as tmp:
                try:
                    path = runs.client.download_artifacts(parent_run_id, f"{folder}/{file}", tmp)
                except Exception:  # a server that cannot be read, an artifact that is not there
                    continue
                found = _read_summary(Path(path), f"artifact {folder}/{file} of run {parent_run_id}")
                if found is not None:
                    return found
        return None
        runs = SweepRuns(self.tracking_target(name, None, disabled=False), name)
        for folder, file in names:
            with tempfile.TemporaryDirectory(prefix="kubesweep-search-") as tmp:
                try:
                    path = runs.client.download_artifacts(parent_run_id, f"{folder}/{file}", tmp)
                    data = json.loads(Path(path).read_text())
                except Exception:  # a server that cannot be read, an artifact that is not there
                    continue
                if isinstance(data, dict):
                    return data
        return None
