"""The API suite's teacher fixtures, shared with the scale-out tests."""

from tests.api.conftest import reference, teacher_url

__all__ = ["reference", "teacher_url"]
