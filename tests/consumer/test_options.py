"""The retry options: one definition, taken alike by every front end.

Pure: reads the package's option classes, its front ends' signatures and its
source. The lines marked ``type: ignore[...]`` are checks too: ``mypy
--strict`` (with ``warn_unused_ignores``) fails if an option's type stops being
seen by the type checker.
"""

from __future__ import annotations

import ast
import typing
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypedDict

import pytest
import tenacity

import delayed_retry
from delayed_retry import (
    ConfigurationError,
    HandlerOptions,
    RetryPolicy,
    RetryRouter,
    RouterOptions,
    SubscriberOptions,
    with_delayed_retry,
)
from delayed_retry.cli.main import build_parser
from delayed_retry.consumer.options import ChainOptions, Option, option_specs, with_defaults
from delayed_retry.faststream import DelayedRetry

SRC = Path(delayed_retry.__file__).resolve().parent

CLASSES = (ChainOptions, SubscriberOptions, HandlerOptions, RouterOptions)


async def handler(message: object) -> None:
    """A consumer callback for the decorator to wrap."""


def _names(options: type) -> set[str]:
    return set(option_specs(options))


def _unpacked(fn: Callable[..., object]) -> object:
    """The TypedDict of a callable's ``**options: Unpack[...]``."""
    hint = typing.get_type_hints(fn)["options"]
    assert typing.get_origin(hint) is typing.Unpack, f"{fn!r} takes no **options: Unpack[...]"
    return typing.get_args(hint)[0]


# One definition.


@pytest.mark.parametrize("options", CLASSES, ids=lambda c: c.__name__)
def test_every_option_has_a_type_a_default_and_help(options: type) -> None:
    specs = option_specs(options)
    assert set(specs) == set(options.__annotations__)
    assert options.__required_keys__ == frozenset()  # type: ignore[attr-defined]
    for name, spec in specs.items():
        assert spec.help.strip(), f"{options.__name__}.{name} has no help"


def test_the_front_ends_take_their_option_classes_typed() -> None:
    assert _unpacked(with_delayed_retry) is HandlerOptions
    overloads = typing.get_overloads(with_delayed_retry)
    assert len(overloads) == 2
    assert _unpacked(overloads[1]) is HandlerOptions
    assert _unpacked(DelayedRetry.__init__) is SubscriberOptions
    assert _unpacked(RetryRouter.__init__) is RouterOptions


def test_the_decorator_and_the_middleware_take_the_same_options_but_queue() -> None:
    # Order per key is the decorator's alone: FastStream's middleware does not take it.
    decorator_only = {"queue", "ordered_by", "ordered_release_after"}
    assert _names(HandlerOptions) - _names(SubscriberOptions) == decorator_only
    assert _names(SubscriberOptions) < _names(HandlerOptions)


def test_the_router_takes_the_shared_subset_and_its_prefetch() -> None:
    assert _names(RouterOptions) - _names(ChainOptions) == {"prefetch"}
    assert _names(ChainOptions) < _names(SubscriberOptions)
    for name in _names(ChainOptions):  # the same definition, not a copy
        assert option_specs(RouterOptions)[name] is option_specs(HandlerOptions)[name]


def _defaults(options: type, *, leave_out: tuple[str, ...] = ()) -> dict[str, Any]:
    return {n: s.default for n, s in option_specs(options).items() if n not in leave_out}


def test_every_front_end_accepts_each_of_its_options_with_its_default() -> None:
    for name, default in _defaults(HandlerOptions).items():
        with_delayed_retry(**{name: default})(handler)
    for name, default in _defaults(SubscriberOptions).items():
        DelayedRetry(**{name: default})
    for name, default in _defaults(RouterOptions).items():
        RetryRouter(queues=["orders"], **{name: default})


def test_left_out_options_are_their_defaults_everywhere() -> None:
    decorated = with_delayed_retry(queue="orders")(handler).options
    explicit = with_delayed_retry(**_defaults(HandlerOptions, leave_out=("queue",)))(handler)
    middleware = DelayedRetry().options
    router = RetryRouter(queues=["orders"])
    assert decorated.policy == RetryPolicy() == explicit.options.policy == middleware.policy
    assert router.policy == RetryPolicy()
    assert decorated.policy.max_retries == delayed_retry.DEFAULT_MAX_RETRIES
    for field in ("topology", "parking_queue", "publish_timeout", "return_to", "hold"):
        assert getattr(decorated, field) == getattr(middleware, field), field
    assert router.prefetch == option_specs(RouterOptions)["prefetch"].default
    assert router.publish_timeout == decorated.publish_timeout


def test_given_options_win_over_the_defaults() -> None:
    wait = tenacity.wait_fixed(3)
    built = DelayedRetry(max_retries=2, wait=wait, return_to="exchange").options
    assert (built.policy.max_retries, built.policy.wait, built.return_to) == (2, wait, "exchange")
    router = RetryRouter(queues=["orders"], max_retries=1, prefetch=4, publish_timeout=2)
    assert (router.policy.max_retries, router.prefetch, router.publish_timeout) == (1, 4, 2.0)


# Unknown names and wrong types: refused when the front end is built.


@pytest.mark.parametrize(
    ("build", "caller"),
    [
        (lambda **kw: with_delayed_retry(**kw), "with_delayed_retry()"),
        (lambda **kw: DelayedRetry(**kw), "DelayedRetry()"),
        (lambda **kw: RetryRouter(queues=["orders"], **kw), "RetryRouter()"),
    ],
    ids=["decorator", "middleware", "router"],
)
def test_an_unknown_option_is_a_type_error_naming_the_front_end_and_the_closest(
    build: Callable[..., object], caller: str
) -> None:
    with pytest.raises(TypeError) as refused:
        build(max_retry=3)
    text = str(refused.value)
    assert text.startswith(f"{caller} got an unexpected keyword argument 'max_retry'")
    assert "did you mean 'max_retries'?" in text
    assert "wait" in text.split("its options:")[1]
    with pytest.raises(TypeError, match="'colour'") as far:
        build(colour="red")
    assert "did you mean" not in str(far.value)


def test_options_of_another_front_end_are_refused_with_a_reason() -> None:
    with pytest.raises(TypeError, match=r"^RetryRouter\(\) .* 'return_to'"):
        RetryRouter(queues=["orders"], return_to="queue")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="'prefetch'"):
        with_delayed_retry(prefetch=3)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="each subscriber's failures to that subscriber's own"):
        DelayedRetry(queue="orders")  # type: ignore[call-arg]


def test_wrong_types_fail_the_type_check_and_the_configuration_check() -> None:
    with pytest.raises(ConfigurationError, match="max_retries='5' must be an int"):
        with_delayed_retry(max_retries="5")  # type: ignore[call-overload]
    with pytest.raises(ConfigurationError, match="max_retries='5' must be an int"):
        DelayedRetry(max_retries="5")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="max_retries='5' must be an int"):
        RetryRouter(queues=["orders"], max_retries="5")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="return_to='nowhere'"):
        DelayedRetry(return_to="nowhere")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="prefetch=0 must be a positive int"):
        RetryRouter(queues=["orders"], prefetch=0)


@pytest.mark.parametrize("retry", [ValueError, (KeyError, ValueError)], ids=["class", "tuple"])
def test_exception_classes_as_retry_mean_retry_if_exception_type_in_every_front_end(
    retry: Any,
) -> None:
    state = delayed_retry.RetryState(
        attempt=1, retries=0, queue="orders", original_exchange="", original_routing_key="orders"
    )
    now = datetime.now(UTC)
    for options in (
        with_delayed_retry(retry=retry)(handler).options,
        DelayedRetry(retry=retry).options,
    ):
        assert options.policy.decide(state, ValueError("bad"), now=now).action == "retry"
        parked = options.policy.decide(state, RuntimeError("other"), now=now)
        assert (parked.action, parked.reason) == ("park", "not-retryable")


def test_with_defaults_fills_in_and_refuses() -> None:
    assert with_defaults(RouterOptions, {"prefetch": 1}, caller="f()")["prefetch"] == 1
    filled = with_defaults(RouterOptions, {}, caller="f()")
    assert filled == _defaults(RouterOptions)
    with pytest.raises(TypeError, match=r"^f\(\) got an unexpected keyword argument 'queue'"):
        with_defaults(RouterOptions, {"queue": "q"}, caller="f()")


def test_an_option_without_its_option_spec_is_refused() -> None:
    class Bare(TypedDict, total=False):
        colour: str

    with pytest.raises(TypeError, match=r"Bare\.colour must be Annotated with one Option"):
        option_specs(Bare)

    class Twice(TypedDict, total=False):
        colour: typing.Annotated[str, Option("red", "a"), Option("blue", "b")]

    with pytest.raises(TypeError, match=r"Twice\.colour must be Annotated with one Option"):
        option_specs(Twice)


# Written once in the source.


def _literal(node: ast.expr | None) -> bool:
    """A default written out (``5``, ``"queue"``), not a name for one or ``None``."""
    if isinstance(node, ast.UnaryOp):
        node = node.operand
    return isinstance(node, ast.Constant) and node.value is not None


def _defaults_written(tree: ast.AST) -> Iterator[tuple[str, ast.expr]]:
    """Each (option-like name, default) the source writes: parameters, fields, argparse
    options, ``Option(...)`` annotations and ``DEFAULT_<NAME> = ...`` constants."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = node.args
            positional = [*args.posonlyargs, *args.args]
            with_default = positional[len(positional) - len(args.defaults) :]
            pairs = [
                *zip(with_default, args.defaults, strict=True),
                *zip(args.kwonlyargs, args.kw_defaults, strict=True),
            ]
            yield from ((a.arg, d) for a, d in pairs if d is not None)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if node.value is not None:
                yield node.target.id, node.value
            for call in ast.walk(node.annotation):
                if isinstance(call, ast.Call) and getattr(call.func, "id", "") == "Option":
                    yield node.target.id, call.args[0]
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id.startswith("DEFAULT_"):
                    yield target.id.removeprefix("DEFAULT_").lower(), node.value
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", "") == "add_argument"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and str(node.args[0].value).startswith("--")
        ):
            name = str(node.args[0].value)[2:].replace("-", "_")
            for keyword in node.keywords:
                if keyword.arg == "default":
                    yield name, keyword.value


def _sources() -> Iterator[tuple[Path, ast.AST]]:
    for path in sorted(SRC.rglob("*.py")):
        yield path, ast.parse(path.read_text(), filename=str(path))


NOT_THE_OPTION = {
    ("wait", "testing/fake.py"): "aiormq's wait= flag of the fake channel",
    ("queue", "testing/fake.py"): "the fake's AMQP frame fields",
    ("immediate_retries", "headers/retry_state.py"): "a RetryState's count of the runs so far",
    ("immediate_retries", "consumer/retry_state.py"): "retry_state_scope: the runs so far",
    ("immediate_retries", "faststream/in_memory.py"): "a decision's count of the runs so far",
}
"""Names an option shares with something else, by module, and what they mean there."""


def test_each_options_default_is_written_once_in_the_package() -> None:
    written: dict[str, list[str]] = {}
    # prefetch is the router's here; other services have their own prefetch.
    router_files = {SRC / "consumer" / "router.py", SRC / "cli" / "router_cmd.py"}
    for path, tree in _sources():
        module = path.relative_to(SRC).as_posix()
        for name, default in _defaults_written(tree):
            if name == "prefetch" and path not in router_files and path.name != "options.py":
                continue
            if (name, module) in NOT_THE_OPTION:
                continue
            if _literal(default):
                place = f"{path.relative_to(SRC)}:{default.lineno} {ast.unparse(default)}"
                written.setdefault(name, []).append(place)
    for options in CLASSES:
        for name in option_specs(options):
            assert len(written.get(name, [])) <= 1, f"{name}'s default written twice: {written}"
    assert [p.split(":")[0] for p in written["max_retries"]] == ["recovery/policy.py"]
    assert [p.split(":")[0] for p in written["return_to"]] == ["consumer/options.py"]


def test_the_scan_finds_a_default_written_again() -> None:
    again = ast.parse("def f(*, max_retries: int = 5, queue: str | None = None) -> None: ...")
    found = [(n, ast.unparse(d)) for n, d in _defaults_written(again) if _literal(d)]
    assert found == [("max_retries", "5")]
    cli = ast.parse("p.add_argument('--prefetch', type=int, default=32)")
    assert [(n, ast.unparse(d)) for n, d in _defaults_written(cli)] == [("prefetch", "32")]


# The router command.


def test_the_router_command_takes_its_defaults_and_help_from_the_options() -> None:
    args = build_parser().parse_args(["router", "--queue", "orders"])
    specs = option_specs(RouterOptions)
    assert args.max_retries == specs["max_retries"].default
    assert args.prefetch == specs["prefetch"].default
    (router,) = (
        sub
        for action in build_parser()._actions
        if hasattr(action, "choices") and isinstance(action.choices, dict)
        for name, sub in action.choices.items()
        if name == "router"
    )
    text = " ".join(router.format_help().split())
    assert specs["prefetch"].help in text
    assert specs["max_retries"].help in text
