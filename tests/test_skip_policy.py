"""The suite's skip policy (tests/skip_policy.py) on throwaway test files: a skip for a reason
outside the hardware/environment list fails the run; the allowed ones are counted."""

from __future__ import annotations

import pytest

from tests.skip_policy import EXPECTED

pytest_plugins = ["pytester"]


def test_a_skip_for_any_other_reason_fails_the_run(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        def test_passes():
            pass

        def test_library_missing():
            pytest.skip("C++ CPU kernels unavailable: not built")
        """
    )
    result = pytester.runpytest("-p", "tests.skip_policy")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*1 NOT ALLOWED (fails the run): C++ CPU kernels unavailable*"])


def test_hardware_and_environment_skips_pass_and_are_counted(pytester: pytest.Pytester) -> None:
    reasons = [f"{prefix}: an example" for prefix in EXPECTED]
    pytester.makepyfile(
        "import pytest\n"
        f"@pytest.mark.parametrize('reason', {reasons!r})\n"
        "def test_skips(reason):\n"
        "    pytest.skip(reason)\n"
    )
    result = pytester.runpytest("-p", "tests.skip_policy")
    assert result.ret == pytest.ExitCode.OK
    result.assert_outcomes(skipped=len(reasons))
    result.stdout.fnmatch_lines([f"*1 expected: {reason}" for reason in sorted(reasons)])


def test_a_failing_run_keeps_its_own_status(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_fails():\n    assert False\n")
    result = pytester.runpytest("-p", "tests.skip_policy")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
