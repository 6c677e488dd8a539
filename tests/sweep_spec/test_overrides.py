"""`--set PATH=VALUE` (`kubesweep.sweep_spec.overrides`): a spec file's values overridden before validation, a
problem with a set value named by the option, a malformed option refused in one line naming it."""

from __future__ import annotations

import pytest

from kubesweep.sweep_spec import SpecError, parse_sets, parse_sweep_text

SPEC = """apiVersion: kubesweep.io/v1alpha1
kind: Sweep
metadata: {name: s}
spec:
  job:
    max_steps: 2
    epochs: 3
  matrix:
    batch_size: [8, 16]
  resources: {gpus_per_trial: 0}
"""


def load(*sets: str, text: str = SPEC):  # type: ignore[no-untyped-def]
    return parse_sweep_text(text, source="s.yaml", overrides=parse_sets(sets))


def refusal(*sets: str, text: str = SPEC) -> str:
    with pytest.raises(SpecError) as caught:
        load(*sets, text=text)
    return str(caught.value)


def test_a_set_value_replaces_the_files_and_a_missing_key_is_added() -> None:
    sweep = load("job.max_steps=200", "spec.job.random_init=true", "storage.cache_claim=cache",
                 "matrix.batch_size=[16, 32, 64]", "job.learning_rate=2.0e-5", "metadata.name=other",
                 "repeats=2", "repeat_until={target: 3%, max: 10}")
    job = sweep.spec.job
    assert (job.max_steps, job.random_init, job.epochs, job.learning_rate) == (200, True, 3, 2.0e-5)
    assert sweep.spec.storage.cache_claim == "cache" and sweep.name == "other"
    assert sweep.spec.matrix.batch_size == [16, 32, 64]
    assert sweep.spec.repeat_until is not None and sweep.spec.repeat_until.max == 10
    assert sweep.set_options[:2] == ["--set", "job.max_steps=200"]


def test_null_removes_the_key_and_a_later_option_wins() -> None:
    assert load("job.max_steps=null").spec.job.max_steps is None
    assert load("job.max_steps=").spec.job.max_steps is None
    assert load("job.max_steps=5", "job.max_steps=7").spec.job.max_steps == 7
    assert load("job.max_steps=5", "job={epochs: 1}").spec.job.max_steps is None  # job replaced whole


def test_a_dot_inside_a_key_is_escaped() -> None:
    reference = "reg.example/job@sha256:" + "a" * 64
    sweep = load(f"images.torch-2\\.8-cu128={reference}", "image=torch-2.8-cu128")
    assert sweep.spec.images == {"torch-2.8-cu128": reference}


def test_a_problem_with_a_set_value_names_the_option_not_a_line_of_the_file() -> None:
    assert refusal("job.max_steps=0") == "--set job.max_steps=0: spec.job.max_steps: must be >= 1, got 0"
    assert refusal('matrix.batch_size=[16, "x"]') == ('--set matrix.batch_size=[16, "x"]: spec.matrix.batch_size[1]: '
                                                      "expected an integer, got 'x'")
    assert refusal("job.max_step=5") == "--set job.max_step=5: spec.job.max_step: unknown field; did you mean " \
                                        "'max_steps'?"
    assert refusal("metadata.name=Bad_Name") == ("--set metadata.name=Bad_Name: metadata.name: 'Bad_Name' is not a "
                                                 "DNS-1123 label (lowercase letters, digits and '-')")
    # the option that set the value last is the one named
    assert refusal("job.max_steps=5", "job={max_steps: 0}").startswith("--set job={max_steps: 0}: ")
    # a value of the file keeps its line, beside one of the command line
    both = refusal("job.max_steps=0", text=SPEC.replace("epochs: 3", "epochs: -1")).splitlines()
    assert "--set job.max_steps=0: spec.job.max_steps: must be >= 1, got 0" in both
    assert any(line.startswith("s.yaml:7: spec.job.epochs: ") for line in both), both


@pytest.mark.parametrize(("option", "expected"), [
    ("job.max_steps", "--set job.max_steps: no '=' in it: expected PATH=VALUE"),
    ("=1", "--set =1: the path before '=' is empty: expected PATH=VALUE"),
    ("job..x=1", "--set job..x=1: the path 'job..x' has an empty part"),
    ("job.=1", "--set job.=1: the path 'job.' has an empty part"),
    ("jobs.max_steps=1", "--set jobs.max_steps=1: 'jobs' is not a field of a sweep's spec; did you mean 'job'?"),
    ("apiVersion=v2", "--set apiVersion=v2: apiVersion is not set from the command line"),
    ("kind=Job", "--set kind=Job: kind is not set from the command line"),
    ("spec={}", "--set spec={}: names the whole spec"),
    ("metadata={name: x}", "--set metadata={name: x}: names the whole metadata"),
    ("job.max_steps=[1,", "--set job.max_steps=[1,: not valid YAML: a '[' or '{' is not closed"),
    ("job.dataset=a: b", "--set job.dataset=a: b: expected one YAML value on the command line"),
    ("job={a: 1, a: 2}", "--set job={a: 1, a: 2}: a: given twice"),
    ("job.epochs.x=1", "--set job.epochs.x=1: spec.job.epochs is 3, not a mapping: nothing can be set inside it"),
    ("matrix.batch_size.x=1", "--set matrix.batch_size.x=1: spec.matrix.batch_size is [8, 16], not a mapping"),
    ("job.dataset=a\nb: c", "--set job.dataset=a\\nb: c: not valid YAML: mapping values are not allowed here"),
])
def test_a_malformed_option_is_one_line_naming_it(option: str, expected: str) -> None:
    message = refusal(option)
    assert message.startswith(expected) and "\n" not in message, message


def test_an_override_leaves_a_mapping_an_alias_shares_elsewhere_alone() -> None:
    """`job` and an include cell are one mapping through an alias: setting `job.max_steps` changes the job, not the
    cell (the override copies what it changes)."""
    text = SPEC.replace("  job:\n    max_steps: 2\n    epochs: 3\n", "  job: &cell {max_steps: 2, batch_size: 4}\n"
                        "  include: [*cell]\n")
    sweep = load("job.max_steps=9", text=text)
    assert sweep.spec.job.max_steps == 9
    assert sweep.spec.include[0].max_steps == 2
