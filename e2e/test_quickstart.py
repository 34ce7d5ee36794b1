"""The README's quick start, run as written. e2e/test_demo.py runs it in order on a cluster of its own:
`make demo`, the console, step 3's commands ("a job of your own") against the demo's cluster, `make down`.
Here: the make targets it names exist, and step 3's commands against the shared test cluster, where the
job is new and is admitted (on the demo's cluster the examples' resnet50 has already run). `make test` is
the suite that runs these."""

from __future__ import annotations

import re
import subprocess

from e2e.kube import ROOT, kubectl, wait_for

README = ROOT / "README.md"


def quickstart_blocks() -> list[str]:
    text = README.read_text()
    section = text[text.index("## Quick start"):text.index("## Using it")]
    return re.findall(r"```sh\n(.*?)```", section, flags=re.S)


def test_the_quickstart_names_the_make_targets_that_exist():
    first = quickstart_blocks()[0]
    targets = re.findall(r"^make (\S+)", first, flags=re.M)
    assert targets == ["demo", "test"]
    assert "**4. `make down`**" in README.read_text()
    makefile = (ROOT / "Makefile").read_text()
    for target in ("demo", "test", "down"):
        assert re.search(rf"^{target}:", makefile, flags=re.M), f"make {target} is in the README, not the Makefile"


def test_a_job_of_your_own_as_the_readme_says(operator, namespace, tmp_path):
    block = quickstart_blocks()[1]
    lines = [line for line in block.strip().splitlines() if line.strip()]
    assert lines[0].startswith("export KUBECONFIG=$PWD/.flotilla/kubeconfig ")
    # The same commands against the test cluster, in a namespace of this test's own.
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(kubectl("config", "view", "--raw").stdout)
    kubectl("config", "set-context", "--current", f"--namespace={namespace}", f"--kubeconfig={kubeconfig}")
    script = "set -euo pipefail\n" + block.replace("$PWD/.flotilla/kubeconfig", str(kubeconfig))
    out = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert re.search(r"trainingjob\.flotilla\.dev/resnet50\s", out.stdout), out.stdout
    assert re.search(r"servingdeployment\.flotilla\.dev/chat\s", out.stdout), out.stdout
    assert "Events:" in out.stdout  # kubectl describe tj resnet50
    wait_for("resnet50 admitted", lambda: kubectl("get", "tj", "resnet50", "-n", namespace, "-o",
                                                  "jsonpath={.status.phase}").stdout in ("Admitted", "Running"),
             timeout=60)
