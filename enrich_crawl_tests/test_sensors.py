"""The sensor `dataset_specs`: a new spec file in the watched folder registers a dataset (dynamic
partition of `datasets`, `dataset_spec` materialised) and launches enrich_job for it, once."""

from __future__ import annotations

import shutil
import time

import dagster as dg

from enrich_crawl.defs.datasets import dataset_spec
from enrich_crawl.defs.resources import DatasetResource
from enrich_crawl.defs.sensors import dataset_specs
from enrich_crawl.testing.politeweb import build_polite_dataset


def _tick(instance, folder, cursor=None):
    context = dg.build_sensor_context(
        instance=instance,
        cursor=cursor,
        resources={"dataset": DatasetResource(watch_dir=str(folder))},
    )
    return dataset_specs(context), context


def _apply(instance, result) -> None:
    """What the daemon does with a SensorResult's partition requests."""
    for request in result.dynamic_partitions_requests or []:
        if isinstance(request, dg.AddDynamicPartitionsRequest):
            instance.add_dynamic_partitions(request.partitions_def_name, request.partition_keys)
        else:
            for key in request.partition_keys:
                instance.delete_dynamic_partition(request.partitions_def_name, key)


def test_new_spec_is_registered_and_enriched_once(tmp_path):
    folder = tmp_path / "datasets"
    first = build_polite_dataset(folder / "first", shards=2, records_per_host=2, name="first")
    with dg.instance_for_test() as instance:
        result, _ = _tick(instance, folder)
        assert isinstance(result, dg.SensorResult)
        (add,) = result.dynamic_partitions_requests
        assert isinstance(add, dg.AddDynamicPartitionsRequest)
        assert add.partitions_def_name == "datasets" and list(add.partition_keys) == ["first"]
        by_job = {r.job_name: r for r in result.run_requests}
        assert set(by_job) == {"enrich_job", "register_datasets"}
        enrich = by_job["enrich_job"]
        assert enrich.run_config["resources"]["dataset"]["config"]["spec"] == str(first.spec)
        assert enrich.tags["enrich_crawl/dataset"] == "first"
        assert enrich.tags["enrich_crawl/trigger"] == "sensor"
        assert by_job["register_datasets"].partition_key == "first"
        _apply(instance, result)
        assert instance.get_dynamic_partitions("datasets") == ["first"]

        # nothing new: nothing requested
        again, _ = _tick(instance, folder, result.cursor)
        assert isinstance(again, dg.SkipReason)

        # a second dataset appears: only it is new
        build_polite_dataset(folder / "second", shards=2, records_per_host=2, name="second")
        second, _ = _tick(instance, folder, result.cursor)
        assert [r.partition_keys for r in second.dynamic_partitions_requests] == [["second"]]
        assert {r.tags["enrich_crawl/dataset"] for r in second.run_requests} == {"second"}
        _apply(instance, second)

        # the first dataset's table changes: registered again, enriched by the nightly schedule
        time.sleep(0.01)
        with open(folder / "first" / "first.csv", "a", encoding="utf-8") as table:
            table.write("new-record,http://site-0000.test/rec-0.html,\n")
        changed, _ = _tick(instance, folder, second.cursor)
        assert [(r.job_name, r.partition_key) for r in changed.run_requests] == [
            ("register_datasets", "first")
        ]
        assert not changed.dynamic_partitions_requests

        # a spec that is removed is unregistered
        shutil.rmtree(folder / "second")
        removed, _ = _tick(instance, folder, changed.cursor)
        (delete,) = removed.dynamic_partitions_requests
        assert isinstance(delete, dg.DeleteDynamicPartitionsRequest)
        assert list(delete.partition_keys) == ["second"]


def test_invalid_spec_is_not_registered(tmp_path):
    folder = tmp_path / "datasets"
    folder.mkdir()
    (folder / "broken.yaml").write_text("name: broken\nsource: nowhere.csv\n", encoding="utf-8")
    with dg.instance_for_test() as instance:
        result, _ = _tick(instance, folder)
        assert isinstance(result, dg.SkipReason)
        assert "0 dataset(s)" in result.skip_message


def test_without_a_watched_folder_the_sensor_skips(tmp_path, monkeypatch):
    monkeypatch.delenv("ENRICH_DATASETS_DIR", raising=False)
    with dg.instance_for_test() as instance:
        context = dg.build_sensor_context(
            instance=instance, resources={"dataset": DatasetResource()}
        )
        result = dataset_specs(context)
        assert isinstance(result, dg.SkipReason)
        assert "ENRICH_DATASETS_DIR" in result.skip_message


def test_dataset_spec_partition_materialises_the_registered_spec(tmp_path):
    folder = tmp_path / "datasets"
    build_polite_dataset(folder / "first", shards=2, records_per_host=2, name="first")
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("datasets", ["first", "ghost"])
        resources = {"dataset": DatasetResource(watch_dir=str(folder))}
        result = dg.materialize(
            [dataset_spec], partition_key="first", instance=instance, resources=resources
        )
        assert result.success
        (event,) = result.get_asset_materialization_events()
        metadata = event.materialization.metadata
        assert metadata["dataset"].value == "first"
        assert metadata["fields"].value == 1
        assert metadata["id_column"].value == "id"
        # a registered dataset whose spec is gone fails clearly
        failed = dg.materialize(
            [dataset_spec],
            partition_key="ghost",
            instance=instance,
            resources=resources,
            raise_on_error=False,
        )
        assert not failed.success
