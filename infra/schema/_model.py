"""The stack spec's base model: camelCase keys in YAML, snake_case in Python, unknown keys are
errors, and each field's docstring is its description (the one definition the config reference,
the component arguments and the provider schema are checked against)."""

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class _Model(BaseModel):
    """camelCase keys in YAML, snake_case in Python; unknown keys are errors, not silence."""

    model_config = ConfigDict(
        use_attribute_docstrings=True,
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
    )
