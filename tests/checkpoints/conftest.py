import pytest

from ckpt_builders import train_tokenizer


@pytest.fixture(scope="session")
def trained_tokenizer():
    return train_tokenizer()
