"""Several machines of one GPU type in one setting (kubesweep/tracking/machines.py): the rule on known values, and a
setting merged from three machines where one reads 30% below the others, as the same H100 model has."""

from __future__ import annotations

from typing import Any

from kubesweep.gpus import load_catalog
from kubesweep.tracking import aggregate as agg
from kubesweep.tracking.machines import compare
from kubesweep.wire.metrics import fmt_number
from tests.tracking.test_aggregate import record, results


def verdict(values: dict[str, list[float]]) -> Any:
    items = [(machine, v) for machine, vs in values.items() for v in vs]
    return compare(items, lambda i: i[0], lambda i: i[1], unit="samples/s", fmt=fmt_number)


def test_machines_that_agree_are_averaged_and_the_odd_one_of_three_is_named() -> None:
    assert verdict({"a": [100.0, 101.0, 99.0], "b": [100.5, 99.5]}).left_out == []
    assert verdict({"a": [100.0, 101.0]}).left_out == []  # one machine: nothing to compare
    three = verdict({"a": [5400.0, 5420.0, 5380.0], "b": [5350.0, 5440.0], "c": [7686.0, 7700.0, 7672.0]})
    assert [m.name for m in three.left_out] == ["c"]
    assert three.flag == "machine c left out: 7,686 ±0.5% vs 5,398 samples/s on 2 others"
    # no two of three agree: none can be told to be the odd one
    assert verdict({"a": [100.0, 100.1], "b": [200.0, 200.1], "c": [300.0, 300.1]}).left_out == []


def test_two_machines_that_disagree_are_both_kept_and_flagged() -> None:
    two = verdict({"h100-a": [7686.0, 7700.0], "h100-b": [5400.0, 5420.0]})
    assert two.left_out == []
    assert two.flag == "2 machines disagree on samples/s: h100-a 7,693 ±1.2%, h100-b 5,410 ±2.3%"


def on(machine: str, name: str, rate: float, repeat: int) -> Any:
    return record(name, repeat=repeat, res=results(rate, environment={"node_name": machine}))


def test_a_setting_merged_from_three_machines_leaves_out_the_one_that_disagrees() -> None:
    recs = [on("h100-a", "a0", 5400.0, 0), on("h100-a", "a1", 5420.0, 1), on("h100-b", "b0", 5380.0, 0),
            on("h100-b", "b1", 5440.0, 1), on("h100-c", "c0", 7686.0, 0), on("h100-c", "c1", 7700.0, 1)]
    (cell,) = agg.aggregate(recs, catalog=load_catalog())
    assert [t.name for t in cell.trials] == ["a0", "b0", "a1", "b1"]
    assert [t.name for t in cell.left_out] == ["c0", "c1"]
    assert cell.value("samples_per_s") == 5410.0  # not 6,171: the mean over the machines that agree
    assert "machine h100-c left out: 7,693 ±1.2% vs 5,410 samples/s on 2 others" in cell.flags
    doc = agg.to_json([cell], sweep="s", source="files", target=0.9, best_by="samples_per_s")
    assert doc["cells"][0]["left_out"] == [{"id": "c0", "name": "c0", "machine": "h100-c"},
                                           {"id": "c1", "name": "c1", "machine": "h100-c"}]
    # trials with no machine recorded (older results files) are compared with nothing
    (plain,) = agg.aggregate([record("p0", res=results(5400.0)), record("p1", repeat=1, res=results(7686.0))],
                             catalog=load_catalog())
    assert plain.left_out == [] and not any("machine" in f for f in plain.flags)


def on_vm(boot: str | None, name: str, rate: float, repeat: int, gpu_uuid: str = "") -> Any:
    """A trial on a VM whose hostname is `vm`, as every VM of one image may be: told apart by the kernel's boot id,
    or, in results written before it was recorded, by its GPU's UUID."""
    env: dict[str, Any] = {"node_name": "vm", "hostname": "vm",
                           "gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": gpu_uuid}]}
    if boot is not None:
        env["boot_id"] = boot
    return record(name, repeat=repeat, res=results(rate, environment=env))


def test_machines_of_one_hostname_are_told_apart_by_boot_id_or_gpu() -> None:
    recs = [on_vm("aaaaaaaa-1", "a0", 5400.0, 0), on_vm("aaaaaaaa-1", "a1", 5420.0, 1),
            on_vm("bbbbbbbb-2", "b0", 5380.0, 0), on_vm("bbbbbbbb-2", "b1", 5440.0, 1),
            on_vm("cccccccc-3", "c0", 7686.0, 0), on_vm("cccccccc-3", "c1", 7700.0, 1)]
    (cell,) = agg.aggregate(recs, catalog=load_catalog())
    assert [t.name for t in cell.left_out] == ["c0", "c1"]
    assert "machine vm (cccccccc) left out: 7,693 ±1.2% vs 5,410 samples/s on 2 others" in cell.flags
    # older results: no boot id, the GPU's UUID tells the machines apart
    old = [on_vm(None, "a0", 5400.0, 0, "2f2f41ff-6b31"), on_vm(None, "a1", 5420.0, 1, "2f2f41ff-6b31"),
           on_vm(None, "b0", 7686.0, 0, "8b27bc16-c3f7"), on_vm(None, "b1", 7700.0, 1, "8b27bc16-c3f7")]
    (two,) = agg.aggregate(old, catalog=load_catalog())
    assert "2 machines disagree on samples/s: vm (2f2f41ff) 5,410 ±2.3%, vm (8b27bc16) 7,693 ±1.2%" in two.flags
    # one machine's repeats on one hostname, whatever the GPU said: nothing to compare
    (one,) = agg.aggregate([on_vm("aaaaaaaa-1", "a0", 5400.0, 0), on_vm("aaaaaaaa-1", "a1", 7686.0, 1)],
                           catalog=load_catalog())
    assert not any("machine" in f for f in one.flags)


def from_checkout(checkout: str, name: str, rate: float, repeat: int, rows: int = 67349) -> Any:
    """A trial of one spec run from a checkout at `checkout`: its dataset resolved to a path inside it."""
    return record(name, repeat=repeat, dataset=f"{checkout}/data/sst2",
                  res=results(rate, data={"dataset": f"{checkout}/data/sst2", "train_rows": rows, "eval_rows": 872}))


def test_one_spec_run_from_two_checkouts_meets_in_one_setting() -> None:
    recs = [from_checkout("/work/main", "a0", 5400.0, 0), from_checkout("/work/main", "a1", 5420.0, 1),
            from_checkout("/tmp/ks", "b0", 5380.0, 0), from_checkout("/tmp/ks", "b1", 5440.0, 1),
            record("p2", repeat=2, dataset="/tmp/ks/data/sst2")]  # pending: no results yet, same setting
    (cell,) = agg.aggregate(recs, catalog=load_catalog())
    assert len(cell.trials) == 5 and "dataset" not in cell.extra
    # two datasets of one name that held different rows are two settings, named by their whole paths
    other = [from_checkout("/work/main", "a0", 5400.0, 0), from_checkout("/srv/small", "s0", 5400.0, 0, rows=1000)]
    cells = agg.aggregate(other, catalog=load_catalog())
    assert sorted(c.extra["dataset"] for c in cells) == ["/srv/small/data/sst2", "/work/main/data/sst2"]


def probe(tflops: float) -> dict[str, Any]:
    return {"precision": "bf16", "dtype": "bfloat16", "size": 8192, "repeats": 5, "matmuls_per_repeat": 10,
            "best_s": 10 * 2 * 8192**3 / tflops / 1e12, "tflops_per_s": tflops, "seconds": 1.0}


def test_machines_that_disagree_are_told_apart_by_their_gemm_probes() -> None:
    def at(machine: str, name: str, rate: float, repeat: int, tflops: float | None) -> Any:
        extra: dict[str, Any] = {"environment": {"node_name": machine}}
        if tflops is not None:
            extra["probe"] = probe(tflops)
        return record(name, repeat=repeat, res=results(rate, **extra))

    two = [at("h100-a", "a0", 7686.0, 0, 712.0), at("h100-a", "a1", 7700.0, 1, 708.0),
           at("h100-b", "b0", 5400.0, 0, 548.0), at("h100-b", "b1", 5420.0, 1, None)]
    (cell,) = agg.aggregate(two, catalog=load_catalog())
    assert ("2 machines disagree on samples/s: h100-a 7,693 ±1.2% (GEMM probe 710 TFLOP/s), "
            "h100-b 5,410 ±2.3% (GEMM probe 548 TFLOP/s)") in cell.flags
    three = [*two, at("h100-c", "c0", 5380.0, 2, None), at("h100-c", "c1", 5440.0, 3, None)]
    (cell,) = agg.aggregate(three, catalog=load_catalog())
    assert "machine h100-a left out: 7,693 ±1.2% (GEMM probe 710 TFLOP/s) vs 5,410 samples/s on 2 others" in cell.flags
