"""The TrainingJob flow a newcomer follows first (kubectl apply to Running pods, then a rescale through a
checkpoint) enters no file twice on one call chain, as scripts/flow_files.py measures it (docs/design.md)."""

from scripts.flow_files import measure


def test_the_training_flow_enters_no_file_twice():
    got = measure("training")
    assert got["twice"] == {}, got["twice"]
    # It went the whole way: the rescale's new worker set runs, on the reshard's worker set number.
    assert got["outcome"]["reshards"] == 1 and len(got["outcome"]["pods"]) == 2
    files = got["files"]
    for step in ("operator/watch.py", "operator/reconcile.py", "reshard/protocol.py", "allocation/elastic.py",
                 "operator/kube.py", "worker/client.py"):
        assert f"src/flotilla/{step}" in files, step
    assert files.index("src/flotilla/operator/watch.py") < files.index("src/flotilla/operator/reconcile.py")
