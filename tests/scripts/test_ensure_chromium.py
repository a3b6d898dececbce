"""scripts/ensure_chromium.sh, which `make test` runs: as root it says what it will install before it does,
installs Debian's chromium with what it needs and nothing else, and refuses when that would upgrade an
installed package. apt-get and id are stand-ins on PATH that log their calls and answer a dry run with a
given plan (the real apt would change this machine)."""

import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "ensure_chromium.sh")

NEW_ONLY = """Inst libxnvctrl0 (525.85.05-3~deb12u1 Debian:12.15/oldstable [amd64])
Inst chromium-common (150.0.7871.100-1~deb12u1 Debian:12.15/oldstable [amd64])
Inst chromium (150.0.7871.100-1~deb12u1 Debian:12.15/oldstable [amd64])
"""
WITH_UPGRADE = NEW_ONLY + "Inst libudev1 [252.30-1~deb12u2] (252.38-1~deb12u1 Debian:12.15/oldstable [amd64])\n"


def run_script(tmp_path, plan, uid="0"):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "apt.log"
    (tmp_path / "plan").write_text(plan)
    (bin_dir / "apt-get").write_text(f"""#!/bin/sh
echo "$*" >> {log}
case "$*" in *"install -s "*) cat {tmp_path / "plan"} ;; esac
""")
    (bin_dir / "id").write_text(f"#!/bin/sh\necho {uid}\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:/usr/bin:/bin", MSPROBE_CHROMIUM=str(tmp_path / "no-chromium"))
    proc = subprocess.run(["sh", SCRIPT], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    calls = log.read_text().splitlines() if log.exists() else []
    return proc, calls


def test_says_what_it_installs_then_installs_only_that(tmp_path):
    proc, calls = run_script(tmp_path, NEW_ONLY)
    assert calls == ["install -s --no-install-recommends --no-upgrade chromium",
                     "install -y -q --no-install-recommends --no-upgrade chromium"]
    assert "3 new packages (libxnvctrl0 chromium-common chromium )" in proc.stdout
    assert "no upgrades, no recommended packages" in proc.stdout


def test_refuses_when_installing_would_upgrade_an_installed_package(tmp_path):
    proc, calls = run_script(tmp_path, WITH_UPGRADE)
    assert calls == ["install -s --no-install-recommends --no-upgrade chromium"]   # the dry run only
    assert "would also upgrade installed packages (libudev1 )" in proc.stderr and "not done" in proc.stderr


def test_refreshes_package_lists_only_when_apt_knows_no_chromium(tmp_path):
    proc, calls = run_script(tmp_path, "")
    assert calls[:2] == ["install -s --no-install-recommends --no-upgrade chromium", "update -q"]
    assert "installs nothing" in proc.stdout and "cannot install 'chromium'" in proc.stderr
    assert not any(c.startswith("install -y") for c in calls)


def test_not_root_only_says_what_to_do(tmp_path):
    proc, calls = run_script(tmp_path, NEW_ONLY, uid="1000")
    assert calls == [] and "apt-get install --no-install-recommends chromium" in proc.stderr
