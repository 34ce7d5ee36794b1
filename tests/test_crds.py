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
        assert crd["spec"]["names"]["shortNames"]
        cols = [c["name"] for c in version["additionalPrinterColumns"]]
        assert cols[0] == "Phase" and cols[-1] == "Age"
