"""The checked-in CRDs are exactly what flotilla.resources generates."""

from pathlib import Path

import yaml

from flotilla.resources import crds

ROOT = Path(__file__).resolve().parents[1]


def test_checked_in_crds_match_the_generator():
    for filename, make in crds.CRDS.items():
        path = ROOT / "crds" / filename
        assert path.exists(), f"{path} missing: run `flotilla crds --write crds/`"
        assert path.read_text() == crds.render(make), f"{path} drifted: run `flotilla crds --write crds/`"


def test_crds_have_status_subresource_short_names_and_category():
    for make in crds.CRDS.values():
        crd = yaml.safe_load(crds.render(make))
        version = crd["spec"]["versions"][0]
        assert version["subresources"] == {"status": {}}
        assert crd["spec"]["names"]["categories"] == ["flotilla"]
        cols = [c["name"] for c in version["additionalPrinterColumns"]]
        assert cols[-1] == "Age"
        if crd["spec"]["scope"] == "Namespaced":
            assert crd["spec"]["names"]["shortNames"]
            assert cols[0] == "Phase"


def test_queue_crd_is_cluster_scoped_with_the_usage_columns_and_no_short_name():
    crd = yaml.safe_load(crds.render(crds.queue_crd))
    assert crd["spec"]["scope"] == "Cluster"
    assert "shortNames" not in crd["spec"]["names"]
    cols = [c["name"].upper() for c in crd["spec"]["versions"][0]["additionalPrinterColumns"] if not c.get("priority")]
    assert cols == ["NOMINAL", "USED", "BORROWED", "LENT", "ADMITTED", "PENDING", "AGE"]


def test_jobs_and_deployments_take_an_optional_queue():
    for make in (crds.training_job_crd, crds.serving_deployment_crd):
        schema = make()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
        assert schema["spec"]["properties"]["queue"]["type"] == "string"
        assert "queue" not in schema["spec"].get("required", [])
        assert schema["status"]["properties"]["queue"]["type"] == "string"
