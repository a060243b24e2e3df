"""Real programs the end-to-end tests run as tasks, on the local backend and on Slurm."""

HOG = '''\
"""hog.py STAGE INDEX MB:SECONDS ROOT: hold MB megabytes for SECONDS, write a value and the
process's own peak RSS (MB) to ROOT/STAGE/INDEX."""
import pathlib, resource, sys, time

stage, index, spec, root = sys.argv[1], int(sys.argv[2]), sys.argv[3], pathlib.Path(sys.argv[4])
mb, seconds = map(float, spec.split(":"))
block = b"x" * int(mb * 2**20)
if stage == "gen":
    value = index + 1
elif stage == "square":
    value = int((root / "gen" / str(index % 4)).read_text().split()[0]) ** 2
else:
    value = sum(int(p.read_text().split()[0]) for p in (root / "square").iterdir())
time.sleep(seconds)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
(root / stage).mkdir(exist_ok=True)
(root / stage / str(index)).write_text(f"{value} {peak:.1f}\\n")
'''


def hog_value(text: str) -> int:
    """The value a hog.py run wrote (its first word; its peak RSS follows)."""
    return int(text.split()[0])
