import subprocess
import sys


def test_sdk_imports_and_validates_specs_without_torch_or_ray():
    code = (
        "import sys; from tgc_rl.sdk import Client; from tgc_rl.config import JobSpec; "
        "JobSpec.parse({'objective': {'name': 'cp_grpo'}}); "
        "print(sorted(m for m in ('torch', 'ray', 'fastapi') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
