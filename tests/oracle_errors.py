"""Comparing how jitgrad and torch refuse a bad argument: the same exception type, and a
message that starts with the same words (jitgrad's names spelled as torch's). Used by the
table-driven validation tests (tests/nn/test_nn_validation.py, tests/optim/test_optim_validation.py)."""
import warnings

import torch

import jitgrad

WORDS = 4  # the words of the message that must agree


def norm(msg, words=WORDS):
    """The first words of a message, with jitgrad's names spelled as torch's."""
    msg = msg.replace("jitgrad.", "torch.").strip("'\"")
    return " ".join(msg.split()[:words])


def outcome(case, T):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            case(T)
        except Exception as e:  # noqa: BLE001
            return e
    return None


def same_error(case, words=WORDS):
    """case(torch) and case(jitgrad) both accept, or both raise torch's type with messages
    whose first `words` words agree."""
    te, je = outcome(case, torch), outcome(case, jitgrad)
    if te is None:
        assert je is None, f"torch accepts this; jitgrad raised {type(je).__name__}: {je}"
        return
    assert je is not None, f"torch raised {type(te).__name__}: {te}; jitgrad accepted it"
    # the same type, or a subclass (what `except torch's type` catches)
    assert isinstance(je, type(te)), f"torch: {type(te).__name__}: {te}\njitgrad: {type(je).__name__}: {je}"
    assert norm(str(je), words) == norm(str(te), words), f"torch: {te}\njitgrad: {je}"
