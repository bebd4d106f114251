"""Chat templates render in a sandbox, with HF's helpers."""

import pytest

from refengine.tokenizer import ChatMessage, ChatTemplate, ChatTemplateError, TokenizerError

MESSAGES = [ChatMessage("system", "Be brief."), ChatMessage("user", "Hi")]


def test_renders_messages_generation_prompt_and_special_tokens() -> None:
    template = ChatTemplate(
        "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}]{{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}",
        bos_token="<s>",
    )
    assert template.render(MESSAGES) == "<s>[system]Be brief.\n[user]Hi\n[assistant]"
    assert template.render(MESSAGES, add_generation_prompt=False) == "<s>[system]Be brief.\n[user]Hi\n"


def test_raise_exception_becomes_chat_template_error() -> None:
    template = ChatTemplate(
        "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    )
    with pytest.raises(ChatTemplateError, match="System role not supported"):
        template.render(MESSAGES)
    assert template.render(MESSAGES[1:]) == ""


def test_sandbox_blocks_python_internals() -> None:
    template = ChatTemplate("{{ messages.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(ChatTemplateError):
        template.render(MESSAGES)


def test_tojson_keeps_unicode_and_bad_syntax_is_reported() -> None:
    assert ChatTemplate("{{ messages[0].content | tojson }}").render([ChatMessage("user", "é")]) == '"é"'
    with pytest.raises(TokenizerError, match="does not compile"):
        ChatTemplate("{% for m in messages %}")
