"""scripts/apt_mirror.sh: the Debian mirror scripts/setup_hip_toolchain.sh writes into its
private sources list is the one of this machine's apt configuration, read from sample files."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "apt_mirror.sh"
pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("awk") is None, reason="needs bash and awk")


def mirror(*files: Path) -> tuple[int, str]:
    cmd = 'source "$0"; apt_debian_mirror "$@"'
    r = subprocess.run(["bash", "-c", cmd, str(SCRIPT), *map(str, files)], capture_output=True, text=True)
    assert not r.stderr, r.stderr
    return r.returncode, r.stdout.strip()


def snapshot(uri: str) -> tuple[int, str]:
    r = subprocess.run(["bash", "-c", 'source "$0"; apt_snapshot_archive "$1"', str(SCRIPT), uri],
                       capture_output=True, text=True)
    return r.returncode, r.stdout.strip()


DEBIAN_IMAGE = """\
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
# http://snapshot.debian.org/archive/debian-security/20250520T000000Z
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""


@pytest.mark.parametrize("name, text, want", [
    ("debian.sources", DEBIAN_IMAGE, "http://deb.debian.org/debian"),
    ("security-first.sources", DEBIAN_IMAGE.split("\n\n")[1] + "\n\n" + DEBIAN_IMAGE.split("\n\n")[0].replace(
        "http://deb.debian.org/debian", "http://mirror.internal:8080/debian/"), "http://mirror.internal:8080/debian"),
    ("disabled.sources", "Types: deb\nURIs: http://off.example/debian\nSuites: trixie\nEnabled: no\n\n"
                         "Types: deb-src deb\nURIs: http://a.example/debian http://b.example/debian\nSuites: trixie\n",
     "http://a.example/debian"),
    ("folded.sources", "Types: deb\nURIs:\n http://ftp.de.debian.org/debian\nSuites:\n sid\nComponents: main\n",
     "http://ftp.de.debian.org/debian"),
    ("sources.list", "# deb http://commented.example/debian sid main\n"
                     "deb-src http://src.example/debian sid main\n"
                     "deb [arch=amd64 signed-by=/usr/share/keyrings/x.gpg] https://mirror.example.org/debian/ bookworm main\n",
     "https://mirror.example.org/debian"),
    ("proxy.list", "deb https://packages.cloud.google.com/apt cloud-sdk-bookworm main\n"
                   "deb http://apt-cache.local:3142/debian trixie main contrib\n", "http://apt-cache.local:3142/debian"),
    ("by-suite.list", "deb http://mirror.example.com/pub/linux/debian-archive sid main\n",
     "http://mirror.example.com/pub/linux/debian-archive"),
    ("snapshot.list", "deb [check-valid-until=no] http://snapshot.debian.org/archive/debian/20250520T000000Z bookworm main\n",
     "http://snapshot.debian.org/archive/debian/20250520T000000Z"),
])
def test_mirror_from_sample_files(tmp_path, name, text, want):
    path = tmp_path / name
    path.write_text(text)
    assert mirror(path) == (0, want)


def test_third_party_and_security_sources_only_give_no_mirror(tmp_path):
    files = [tmp_path / "nodesource.sources", tmp_path / "google.list", tmp_path / "sec.list"]
    files[0].write_text("Types: deb\nURIs: https://deb.nodesource.com/node_20.x\nSuites: nodistro\nComponents: main\n")
    files[1].write_text("deb https://packages.cloud.google.com/apt cloud-sdk-bookworm main\n")
    files[2].write_text("deb http://security.debian.org/debian-security bookworm-security main\n")
    assert mirror(*files) == (1, "")


def test_first_file_with_a_mirror_wins(tmp_path):
    a, b = tmp_path / "a.list", tmp_path / "b.sources"
    a.write_text("deb https://packages.cloud.google.com/apt cloud-sdk-bookworm main\n")
    b.write_text("Types: deb\nURIs: http://second.example/debian\nSuites: trixie\n")
    assert mirror(a, b) == (0, "http://second.example/debian")


def test_snapshot_archive_of_a_snapshot_mirror():
    assert snapshot("http://snapshot.debian.org/archive/debian/20250520T000000Z/") == (
        0, "http://snapshot.debian.org/archive/debian")
    assert snapshot("http://deb.debian.org/debian")[0] == 1


def test_this_machines_apt_configuration_does_not_fail():
    rc, out = mirror()
    assert rc in (0, 1) and (rc == 1 or out.startswith(("http://", "https://", "file:", "ftp://"))), out


def test_setup_script_takes_the_mirror_from_apt_mirror_sh():
    text = (SCRIPT.parent / "setup_hip_toolchain.sh").read_text()
    sources = [line for line in text.splitlines() if line.startswith("deb ")]
    assert sources and all("$MIRROR" in s or "$SNAPSHOT_URL" in s for s in sources), sources
