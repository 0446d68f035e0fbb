"""The contract every connection kind passes, as a library: the project's own 21 kinds and
a user's kind run the same checks.

    from resnmt.testing import check_connection
    check_connection("layerscale")        # every check, every case of the kind: AssertionError if one fails

or, in a pytest file, one test per case and check::

    import pytest
    from resnmt.testing import contract_params, run_check

    @pytest.mark.parametrize("case, check", contract_params(["layerscale"]))
    def test_contract(case, check):
        run_check(case, check)

A kind's cases are its defaults and one case per other value of each switch and choice it
declares (``cases``); ``Case(name, flags)`` makes one of your own (other numbers, the
encoder and decoder of different kinds). The checks, in order (:data:`CHECKS`, their
docstrings in :mod:`resnmt.testing.contract`): ``spec`` (the class, its flags and
statistics), ``forward`` (several depths, training, evaluation, bf16), ``gradients`` (every parameter gets one,
except those the kind lists in ``no_gradient_by_design``), ``incremental`` (step-by-step
decoding equals the full forward; bf16), ``beam_search`` (the fast beam search returns
fairseq's hypotheses), ``torchscript``, ``checkpoint`` (saved,
loaded by fairseq, the same outputs), ``fast_path`` (``--fast-path``'s update equals
fairseq's), ``normalization`` (``--normalization``), ``analysis`` (the statistics
``resnmt-analyze`` reports). The models are tiny (d=16, 2 heads, 1 to 3 layers) on a
corpus of made-up words (:mod:`resnmt.testing.tiny`), so a kind's whole contract takes
seconds on a CPU.
"""
from typing import Iterable, List, Optional, Sequence, Union

from resnmt.testing.contract import CHECKS, Case, cases

__all__ = ["CHECKS", "Case", "cases", "check_connection", "contract_params", "run_check"]


def run_check(case: Case, check: str) -> None:
    """Run the check named ``check`` on ``case``."""
    CHECKS[check][0](case)


def contract_items(kinds: Iterable[Union[str, Case]], checks: Optional[Sequence[str]] = None) -> List[tuple]:
    """``(case, check)`` for each kind's cases (a ``Case`` given as is) and each check that
    runs on them: every check on a kind's defaults, those marked so on its variants too."""
    items = []
    for kind in kinds:
        own = [kind] if isinstance(kind, Case) else cases(kind)
        for i, case in enumerate(own):
            for name, (_, on_variants) in CHECKS.items():
                if (checks is None or name in checks) and (i == 0 or on_variants):
                    items.append((case, name))
    return items


def contract_params(kinds: Iterable[Union[str, Case]], checks: Optional[Sequence[str]] = None) -> list:
    """:func:`contract_items` as ``pytest.param`` s with readable ids (``kind-check``)."""
    import pytest

    return [pytest.param(case, check, id=f"{case.name}-{check}") for case, check in contract_items(kinds, checks)]


def check_connection(kind: Union[str, Case], checks: Optional[Sequence[str]] = None) -> None:
    """Every check (or those named) on every case of ``kind``; the first failure is an
    AssertionError naming the case and the check."""
    for case, check in contract_items([kind], checks):
        try:
            run_check(case, check)
        except Exception as e:
            raise AssertionError(f"connection contract: {case.name}: check {check} failed: "
                                 f"{type(e).__name__}: {e}") from e
