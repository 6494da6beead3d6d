"""The CPU example job (configs/jobs/tiny-gpt-cpu.toml) as the tests and benchmarks that do not
prepare tokens run it: on the novels character by character, without the validation split. What
they test is not the tokenizer, and the novels need no preparing."""
import re

_TOKEN_DATA = re.compile(r'(?m)^kind = "tokens".*\n(^(path|val_path|tokenizer) = .*\n)*')
_VALIDATION = re.compile(r"(?m)^val_(every|batches) = .*\n")


def character_level(text):
    """The example job's text with [data] on character-level Jane Austen and no validation keys.
    ValueError when its [data] is not the prepared token files."""
    text, n = _TOKEN_DATA.subn('kind = "janeaustenr"\n', text)
    if n != 1:
        raise ValueError("the example job's [data] is not the prepared token files")
    return _VALIDATION.sub("", text)
