"""The README runs as written: every code block, Python ones as scripts in a subprocess and
shell ones in bash, from a fresh folder holding the small data files the blocks name.

Exceptions, by rule and not by hand-picking: the first two lines of the README (installation:
``pip install`` then the test suite) are not run; the port 8786 of the "existing cluster"
blocks becomes a free port, so parallel test runs never fight over it.
"""
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)


def blocks() -> list[tuple[str, str]]:
    return [(lang, body) for lang, body in BLOCK.findall((ROOT / "README.md").read_text())]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _data_files(where: Path) -> None:
    """Tiny files in the real formats, at the paths the README's loader example names."""
    (where / "ml-100k").mkdir()
    lines = [f"{u}\t{i}\t{1 + (u * 7 + i * 3) % 5}\t{880000000 + u * 100 + i}\n"
             for u in range(1, 41) for i in range(1, 31) if (u + i) % 3]
    (where / "ml-100k" / "u.data").write_text("".join(lines))
    triples = [(d, w, 1 + (d + w) % 3) for d in range(1, 31) for w in range(1, 21) if (d * w) % 4 == 1 or w == d % 20 + 1]
    (where / "docword.kos.txt").write_text(f"30\n20\n{len(triples)}\n" + "".join(f"{d} {w} {c}\n" for d, w, c in triples))
    (where / "vocab.kos.txt").write_text("".join(f"word{j}\n" for j in range(20)))
    rows = [f"{k % 3} " + " ".join(f"{j}:{((k * j) % 7) / 7 + (k % 3 == j % 3):.3f}" for j in range(1, 9)) + "\n"
            for k in range(120)]
    (where / "news20.svm").write_text("".join(rows))
    import pandas as pd

    users, items = zip(*[(u, i) for u in range(50) for i in range(30) if (u * i) % 4 != 1])
    pd.DataFrame({"user": users, "item": items, "rating": [1.0 + (u + 2 * i) % 5 for u, i in zip(users, items)]}
                 ).to_parquet(where / "ratings.parquet")


def test_the_readme_has_the_blocks_this_test_expects():
    langs = [lang for lang, _ in blocks()]
    assert set(langs) <= {"python", "bash"}, langs  # every block is one this test runs
    assert langs.count("python") >= 5 and langs.count("bash") >= 2
    first = blocks()[0][1].splitlines()
    assert len(first) == 2 and all(line.startswith("pip install") for line in first)


def _cases():
    out = []
    for n, (lang, body) in enumerate(blocks()):
        if n == 0:
            continue  # the two installation lines
        out.append(pytest.param(lang, body, id=f"{n}-{lang}-{body.splitlines()[0][:30]}"))
    return out


@pytest.mark.timeout(400)
@pytest.mark.parametrize("lang, body", _cases())
def test_readme_block_runs_as_written(lang, body, tmp_path):
    _data_files(tmp_path)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
               DASK_DISTRIBUTED__SCHEDULER__WORKER_TTL="10s")
    if lang == "python":
        script = tmp_path / "block.py"
        script.write_text(body)
        cmd = [sys.executable, str(script)]
    else:
        script = tmp_path / "block.sh"
        script.write_text("set -e\n" + body.replace("8786", str(_free_port())))
        cmd = ["bash", str(script)]
    # output to files, not pipes: a block's background processes would hold pipes open
    with open(tmp_path / "out.txt", "w") as o, open(tmp_path / "err.txt", "w") as e:
        p = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=o, stderr=e, start_new_session=True)
        try:
            p.wait(timeout=360)
        finally:
            try:  # background processes a shell block started (and left behind if it failed)
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    out, err = (tmp_path / "out.txt").read_text(), (tmp_path / "err.txt").read_text()
    assert p.returncode == 0, f"--- block:\n{body}\n--- stdout:\n{out[-3000:]}\n--- stderr:\n{err[-5000:]}"
