"""What the gateway hook does to a chat request's messages (engine.integrations.chat_context), apart
from LiteLLM: the settings' layers and their errors, which texts are pruned and compressed, the
question, and the rewrite in place (tests/server/test_litellm.py runs it in a real proxy)."""

from __future__ import annotations

import copy

import pytest

from engine.errors import InputError
from engine.integrations.chat_context import HookSettings, Target, plan, question_of, rewritten, texts_of

pytestmark = pytest.mark.unit

Q = "Why did the council not repair the bridge?"
ON = HookSettings(enabled=True)


def test_layers_turn_the_hook_on_merge_their_options_and_name_where_a_bad_one_came_from():
    config = HookSettings().merged(
        {"prune_tool_results": True, "prune_options": {"threshold": 0.3}}, "config", False
    )
    assert not config.enabled and config.prune_tool_results
    team = config.merged({"prune_options": {"budget_tokens": 50}}, "team metadata")
    assert team.enabled and team.prune_options == {"threshold": 0.3, "budget_tokens": 50}
    assert not team.merged(False, "key metadata").enabled and team.merged(True, "request").enabled
    key = team.merged({"enabled": False, "compress_rate": 0.4}, "key metadata")
    assert not key.enabled and key.compress_body() == {"rate": 0.4}
    assert key.merged({"compress_target_token": 30}, "r").compress_body() == {"rate": 0.4, "target_token": 30}
    for layer, message in [
        (
            {"prune_tool_result": True},
            "request metadata: unknown setting 'prune_tool_result'; did you mean 'prune_tool_results'?",
        ),
        ({"compress_rate": 2}, "request metadata: compress_rate must be a number in (0, 1], got 2"),
        ({"compress_target_token": 0}, "request metadata: compress_target_token must be a positive integer"),
        ({"prune_options": {"treshold": 0.3}}, "request metadata: unknown option 'treshold'"),
        (
            {"prune_options": {"top_k": 1}},
            "request metadata: prune_options top_k: they rank and drop passages",
        ),
        ({"compress_options": {"context": "x"}}, "request metadata: compress_options must be an object"),
        ({"compress_roles": "tool"}, "request metadata: compress_roles must be a list of strings"),
        ({"context_tags": ["<c>"]}, "request metadata: context_tags must be a list of strings"),
        ({"compress_min_chars": -1}, "request metadata: compress_min_chars must be a whole number"),
        ("on", "request metadata: prune_engine must be an object of settings, got 'on'"),
    ]:
        with pytest.raises(InputError) as err:
            config.merged(layer, "request metadata")
        assert str(err.value).startswith(message), str(err.value)


def test_tool_results_and_context_blocks_are_passages_against_the_last_user_messages_question():
    s = HookSettings(enabled=True, prune_tool_results=True, prune_context_tags=True)
    messages = [
        {"role": "system", "content": "Rules. <context>System passage.</context>"},
        {"role": "user", "content": "Earlier question?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c0"}]},
        {"role": "tool", "tool_call_id": "c0", "content": [{"type": "text", "text": "Tool passage."}]},
        {"role": "tool", "tool_call_id": "c1", "content": "  "},  # nothing to prune
        {
            "role": "user",
            "content": f"<context>First.</context>\n<context></context>{Q} <context>Last.</context>",
        },
    ]
    p = plan(messages, s)
    assert p.question == Q and not p.compress
    texts = [dict(texts_of(messages[t.message]))[t.part][t.start : t.end] for t in p.prune]
    assert texts == ["System passage.", "Tool passage.", "First.", "Last."]
    assert p.prune[1] == Target(3, 0, 0, len("Tool passage."))
    assert plan(messages, HookSettings(enabled=True, prune_tool_results=True, prune_min_chars=14)).prune == []
    no_question = plan([messages[3], {"role": "user", "content": "<context>Only.</context>"}], s)
    assert no_question.empty and no_question.notes == [
        "no question (no user message with text) to prune against"
    ]
    assert (
        question_of(
            [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b?"}]}], s
        )
        == "a b?"
    )


def test_compression_takes_the_roles_and_lengths_named_but_never_the_question_or_a_pruned_text():
    long = "x" * 600
    messages = [
        {"role": "system", "content": long},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": long}, {"type": "image_url", "image_url": {}}],
        },
        {"role": "tool", "content": long},
        {"role": "user", "content": "short"},
        {"role": "user", "content": long},  # the question
    ]
    s = HookSettings(enabled=True, compress_roles=("system", "assistant", "tool", "user"))
    assert [(t.message, t.part) for t in plan(messages, s).compress] == [(0, None), (1, 0), (2, None)]
    both = plan(
        messages, HookSettings(enabled=True, prune_tool_results=True, compress_roles=("tool", "system"))
    )
    assert [t.message for t in both.prune] == [2] and [t.message for t in both.compress] == [0]
    shorter = HookSettings(enabled=True, compress_roles=("user",), compress_min_chars=0)
    assert [t.message for t in plan(messages, shorter).compress] == [3]


def test_the_rewrite_replaces_only_the_targets_texts_in_copies():
    messages = [
        {"role": "user", "content": "<context>aaa</context> and <context>bbb</context>?", "name": "u"},
        {
            "role": "tool",
            "content": [{"type": "text", "text": "tool text"}, {"type": "text", "text": "more"}],
        },
        {"role": "assistant", "content": "kept"},
    ]
    before = copy.deepcopy(messages)
    s = HookSettings(enabled=True, prune_tool_results=True, prune_context_tags=True)
    p = plan(messages, s)
    new = rewritten(messages, dict(zip(p.prune, ["A", "", "T", "M"])))
    assert new[0] == {"role": "user", "content": "<context>A</context> and <context></context>?", "name": "u"}
    assert new[1]["content"] == [{"type": "text", "text": "T"}, {"type": "text", "text": "M"}]
    assert new[2] is messages[2] and messages == before
