"""The seed_dataset asset: the profile reaches the UI as plottable numbers and markdown tables."""

from __future__ import annotations

import dagster as dg

from enrich_crawl.dataset import synth
from enrich_crawl.dataset.profile import profile_checks
from enrich_crawl.defs.assets import seed_dataset
from enrich_crawl.defs.resources import DatasetResource, QualityResource, StagingResource
from enrich_crawl.staging import read_json


def test_seed_dataset_materialises_with_profile_metadata(tmp_path):
    source = tmp_path / "dirty.csv"
    truth = synth.write_dirty_csv(source, 2000, seed=12, dirt=5)
    spec = synth.write_spec(tmp_path, source.name)
    result = dg.materialize(
        [seed_dataset],
        resources={
            "dataset": DatasetResource(spec=str(spec)),
            "staging": StagingResource(root=str(tmp_path / "work")),
            "quality": QualityResource(),
        },
    )
    assert result.success
    # the seed's checks are evaluated in its own step, after it
    checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert set(checks) == {"seed_profile", "seed_data_quality"}
    [event] = result.get_asset_materialization_events()
    metadata = event.materialization.metadata
    assert metadata["rows"].value == truth.rows
    assert metadata["quarantined_rows"].value == len(truth.malformed)
    assert metadata["duplicate_ids"].value == len(truth.duplicates)
    assert isinstance(metadata["missing_rate/employees"].value, float)
    assert isinstance(metadata["missing/city"].value, int)
    assert "| employees |" in metadata["profile"].value
    assert "malformed row" in metadata["rejected_sample"].value
    assert "type_error_sample" in metadata and "quality_checks" in metadata
    manifest = read_json(tmp_path / "work" / "dirty" / "seed" / "manifest.json")
    assert metadata["usable_records"].value == manifest["profile"]["usable"]


def test_profile_checks_flag_what_needs_a_look():
    manifest = {
        "profile": {
            "rows": 10,
            "usable": 0,
            "rejected": 10,
            "quarantined": 10,
            "missing_ids": 0,
            "duplicate_ids": 0,
            "urls": 0,
            "invalid_urls": 0,
            "reading": {"undecodable_lines": 2, "undecodable_sample": [3, 4]},
        }
    }
    checks = {c["name"]: c for c in profile_checks(manifest)}
    assert not checks["has_usable_records"]["passed"]
    assert checks["has_usable_records"]["severity"] == "ERROR"
    assert not checks["few_rejected_rows"]["passed"]
    assert not checks["text_decodes"]["passed"]
    assert checks["urls_mostly_valid"]["passed"]
