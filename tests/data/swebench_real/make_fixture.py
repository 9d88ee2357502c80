"""How the fixtures here were made (re-run to remake one): a SWE-bench row's repository as a
shallow bare git repo holding only its base and environment-setup commits, packed as
`owner__name.git.tar.gz` (unpacked into a directory it is a `--repo-mirror`).

    python tests/data/swebench_real/make_fixture.py MIRROR_GIT_DIR owner/name BASE ENV_SETUP [MORE ...]

More commits (several rows of one repository) go into the same archive; SWERL_FIXTURE_OUT
names another output directory (data/swebench_sample packs its repositories this way).

MIRROR_GIT_DIR is any clone with both commits (e.g. one brought by the search tool's fetch).
The rows themselves (instances.jsonl) are the dataset's records, not generated here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _plain(ti: tarfile.TarInfo) -> tarfile.TarInfo:
    ti.mtime, ti.uid, ti.gid, ti.uname, ti.gname = 0, 0, 0, "", ""
    return ti


def pack(mirror: str, repo: str, *commits: str, out_dir: Path = HERE) -> Path:
    name = repo.replace("/", "__") + ".git"
    with tempfile.TemporaryDirectory() as tmp:
        bare = Path(tmp) / name
        subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True)
        subprocess.run(["git", "-C", str(bare), "-c", "protocol.file.allow=always", "fetch", "-q", "--depth", "1",
                        f"file://{Path(mirror).resolve()}", *commits], check=True)
        for i, c in enumerate(commits):  # refs keep the commits through gc and clones
            subprocess.run(["git", "-C", str(bare), "update-ref", f"refs/heads/swerl-{i}", c], check=True)
        subprocess.run(["git", "-C", str(bare), "symbolic-ref", "HEAD", "refs/heads/swerl-0"], check=True)
        subprocess.run(["git", "-C", str(bare), "gc", "-q", "--aggressive", "--prune=now"], check=True)
        out = Path(out_dir) / f"{name}.tar.gz"
        with tarfile.open(out, "w:gz") as tf:
            tf.add(bare, arcname=name, filter=_plain)
    return out


if __name__ == "__main__":
    print(pack(sys.argv[1], sys.argv[2], *sys.argv[3:], out_dir=Path(os.environ.get("SWERL_FIXTURE_OUT", HERE))))
