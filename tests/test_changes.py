"""What an edit of a workflow changed, for a run taken up with its file as it is now."""

import pytest

from workflows.changes import Reshaped, changed_stages
from workflows.spec import loads

THREE = """
name = "w"
[[stage]]
name = "c"
after = ["b"]
allocation = { cores = 1 }
tasks = { command = "cat b* > all", outputs = ["all"] }
[[stage]]
name = "b"
after = ["a"]
allocation = { cores = 2 }
tasks = { command = "sort a{index} > b{index}", count = 2 }
[[stage]]
name = "a"
after = []
allocation = { cores = 2, memory = "4G" }
tasks = { command = "make a{index}", count = 2, memory = "1G" }
[[stage]]
name = "d"
after = []
allocation = { cores = 1 }
tasks = { command = "true" }
"""


def test_a_changed_stage_runs_again_with_every_stage_after_it_wherever_the_file_lists_it():
    edited = THREE.replace("make a{index}", "make -B a{index}")
    assert changed_stages(loads(THREE), loads(edited)) == {"a", "b", "c"}
    assert changed_stages(loads(THREE), loads(THREE.replace("cat b*", "cat b0 b1"))) == {"c"}


def test_sizes_and_allocations_change_nothing_that_ran():
    edited = THREE.replace('memory = "4G"', 'memory = "8G"').replace('memory = "1G"', "cores = 2")
    assert changed_stages(loads(THREE), loads(edited)) == frozenset()


@pytest.mark.parametrize(
    ("old", "new", "said"),
    [
        ("count = 2 }\n[[stage]]\nname = \"a\"", "count = 3 }\n[[stage]]\nname = \"a\"",
         "stage b has 3 tasks, the run's had 2"),
        ('name = "d"', 'name = "e"', "its stages are c, b, a, e, the run's were c, b, a, d"),
        ('after = ["a"]', "after = []", "stage b comes after none, in the run after a"),
    ],
)  # fmt: skip
def test_an_edit_of_the_workflows_shape_is_refused(old, new, said):
    assert old in THREE
    with pytest.raises(Reshaped, match=said.replace("(", r"\(")):
        changed_stages(loads(THREE), loads(THREE.replace(old, new)))
