import pytest

from workflows.datasets import DataNotFound, data_dir


@pytest.fixture(scope="session")
def data():
    """The shared traces directory (``../shared/data``)."""
    try:
        return data_dir()
    except DataNotFound as e:
        pytest.fail(str(e))
