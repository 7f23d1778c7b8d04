import subprocess
import sys


def test_control_plane_builds_and_validates_specs_without_importing_torch_or_ray(tmp_path):
    code = (
        "import sys\n"
        "from tgc_rl.control.app import create_app\n"
        "from tgc_rl.control.settings import ControlSettings\n"
        "from tgc_rl.config import JobSpec\n"
        f"create_app(ControlSettings(data_dir={str(tmp_path)!r}, ray_address='local'))\n"
        "JobSpec.parse({'objective': {'name': 'dfpo_min'}})\n"
        "print(sorted(m for m in ('torch', 'ray', 'vllm', 'transformers') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
