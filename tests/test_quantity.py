import pytest

from workflows.quantity import evaluate, seconds, shown, size_mb, whole


@pytest.mark.parametrize(
    ("value", "mb"),
    [
        (4000, 4000),
        (1.5, 1.5),
        ("500", 500),
        ("500M", 500),
        ("500 MB", 500),
        ("4G", 4000),
        ("4g", 4000),
        ("4GB", 4000),
        ("1T", 1_000_000),
        ("512K", 0.512),
        ("1GiB", 1073.741824),
        ("2 MiB", 2.097152),
        ("scale * 4G", 112_000),
        ("scale * 4G + 512M", 112_512),
        ("(scale - 4) * 1G", 24_000),
    ],
)
def test_sizes_in_mb(value, mb):
    assert size_mb(value, scale=28) == pytest.approx(mb)


@pytest.mark.parametrize(
    ("value", "s"),
    [
        (3600, 3600),
        ("3600", 3600),
        ("90m", 5400),
        ("90 min", 5400),
        ("2h", 7200),
        ("1h30m", 5400),
        ("1h 30m 15s", 5415),
        ("1d", 86400),
        ("90:00", 5400),
        ("1:30:00", 5400),
        ("2-12", 216000),
        ("1-02:03", 93780),
        ("1-00:00:01", 86401),
        ("3600 * 28 / scale", 1800),
        ("2h / 2", 3600),
    ],
)
def test_durations_in_seconds(value, s):
    assert seconds(value, scale=56) == pytest.approx(s)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("scale", 28),
        ("scale / 4", 7),
        ("scale // 3", 9),
        ("-scale + 30", 2),
        ("+2", 2),
        ("1e3", 1000),
    ],
)
def test_expressions(text, value):
    assert evaluate(text, scale=28) == value


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "empty expression"),
        ("scale ** 2", "only numbers, scale, + - * / // and parentheses"),
        ("__import__('os').system('true')", "only numbers, scale"),
        ("[1, 2]", "only numbers, scale"),
        ("scale if 1 else 2", "unexpected 'else' after a number"),
        ("(scale if 1 else 2)", "unexpected"),
        ("x + 1", "unknown name 'x'"),
        ("1 / 0", "division by zero"),
        ("scale // (scale - 28)", "division by zero"),
        ("4G", "unexpected 'G' after a number"),
        ("'a'", "unexpected 'a'"),
        ("True", "unexpected True"),
        ("1 +", "cannot read '1 +'"),
        (True, "got a boolean"),
        ([1], "got an array"),
        (None, "got None"),
    ],
)
def test_bad_expressions(value, message):
    with pytest.raises(ValueError) as e:
        evaluate(value, scale=28)
    assert message in str(e.value)


def test_scale_must_be_set_to_be_used():
    assert evaluate("2 * 3") == 6
    with pytest.raises(ValueError, match="uses scale, but no scale is set"):
        evaluate("2 * scale")


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: size_mb("4X"), "unknown unit 'X' in '4X' (known: K, KB, M, MB, G, GB, T, TB"),
        (lambda: seconds("2 hours"), "unknown unit 'hours'"),
        (lambda: seconds("1:xx"), "cannot read '1:xx'"),
        (lambda: size_mb("4G4"), "cannot read"),
    ],
)
def test_unit_errors(call, message):
    with pytest.raises(ValueError) as e:
        call()
    assert message in str(e.value)


def test_whole():
    assert whole(7.0, "cores") == 7
    with pytest.raises(ValueError, match=r"cores must be a whole number, got 7\.5"):
        whole(7.5, "cores")


@pytest.mark.parametrize(
    ("text", "s"),
    [
        ("90:00", 5400),  # the first field may be as large as it likes
        ("100:00:00", 360_000),
        ("1-23:59:59", 172_799),
        ("0:59", 59),
        ("2-23", 255_600),
    ],
)
def test_clock_fields_at_their_limits(text, s):
    assert seconds(text) == s


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("25:99:00", "'25:99:00': minutes must be below 60, got 99"),
        ("1:00:60", "seconds must be below 60, got 60"),
        ("10:75", "seconds must be below 60, got 75"),
        ("1-24:00:00", "hours must be below 24, got 24"),
        ("1-24", "hours must be below 24, got 24"),
        ("1-0:60", "minutes must be below 60, got 60"),
    ],
)
def test_clock_fields_beyond_their_limits(text, message):
    with pytest.raises(ValueError) as e:
        seconds(text)
    assert message in str(e.value)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("1" + "+1" * 200, "is 401 characters long: an expression has at most 256"),
        ("+".join(["1"] * 40), "is nested more than 32 levels deep"),
        ("-" * 40 + "1", "is nested more than 32 levels deep"),
        ("1e308 * 10", "is not a finite number"),
        ("1e400", "is not a finite number"),
        ("1e400G", "is not a finite number"),
        (10**400, "is not a finite number"),
        (float("nan"), "nan is not a finite number"),
        (float("-inf"), "-inf is not a finite number"),
    ],
)
def test_expressions_are_bounded_and_finite(value, message):
    with pytest.raises(ValueError) as e:
        size_mb(value, scale=28)
    assert message in str(e.value)


def test_the_deepest_expression_allowed_evaluates():
    assert evaluate("+".join(["1"] * 31)) == 31
    assert evaluate("(" * 100 + "2" + ")" * 100) == 2  # parentheses add no depth


def test_values_in_messages_are_cut_and_escaped():
    assert shown("w" * 10) == "'wwwwwwwwww'"
    long = shown("w" * 10**6)
    assert len(long) < 120 and long.endswith("(1,000,000 characters)")
    assert shown("a\x1b[2Jb") == "'a\\x1b[2Jb'"
    assert len(shown(list(range(10**6)))) < 100
