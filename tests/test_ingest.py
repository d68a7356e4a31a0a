"""Prompt-file validation: every documented error, reported all at once with line and field."""

from __future__ import annotations

import json

import pytest

from analyzer.prompts.ingest import IngestLimits, PromptFileError, parse_prompt_file


def issues_of(data: bytes, filename: str, **limits) -> list[str]:
    with pytest.raises(PromptFileError) as info:
        parse_prompt_file(data, filename, limits=IngestLimits(**limits))
    return [str(issue) for issue in info.value.issues]


def jsonl(*objects) -> bytes:
    return "".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objects).encode()


def test_txt_one_prompt_per_line_blank_lines_skipped_crlf_handled():
    parsed = parse_prompt_file(b"first\r\n\r\n   \nsecond line  \n", "p.txt")
    assert [(p.line, p.text) for p in parsed.prompts] == [(1, "first"), (4, "second line  ")]
    assert parsed.file_format == "txt" and all(p.task is None for p in parsed.prompts)


def test_jsonl_prompt_messages_task_category_and_id():
    parsed = parse_prompt_file(
        jsonl(
            {"prompt": "a", "task": " Code ", "id": 7, "source": "ignored"},
            {
                "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
                "category": "qa",
                "id": "x",
            },
            {"prompt": "b", "task": ""},
        ),
        "p.jsonl",
    )
    a, chat, b = parsed.prompts
    assert (a.text, a.task, a.external_id) == ("a", "code", "7")
    assert chat.text is None and chat.messages[1] == {"role": "user", "content": "hi"}
    assert (chat.task, chat.external_id, chat.char_count) == ("qa", "x", len("be brief") + 2)
    assert b.task is None
    assert parsed.task_counts() == {"code": 1, "qa": 1, None: 1}


def test_csv_header_quoting_multiline_and_extra_columns():
    data = b'ID,Prompt,Task,notes\n1,"line one\nline two",code,x\n2,"say ""hi""",,y\n'
    parsed = parse_prompt_file(data, "p.csv")
    assert [(p.line, p.text, p.task, p.external_id) for p in parsed.prompts] == [
        (2, "line one\nline two", "code", "1"),
        (4, 'say "hi"', None, "2"),
    ]


def test_all_errors_reported_at_once_with_line_and_field():
    data = jsonl(
        {"prompt": "fine"},
        {"prompt": ""},
        "not json",
        [1, 2],
        {"prompt": "x", "messages": [{"role": "user", "content": "y"}]},
        {"prompt": 5, "task": 3},
        {"messages": []},
        {"messages": [{"role": "user"}]},
        {"text": "wrong key"},
        {"prompt": "ok", "id": True},
    )
    assert issues_of(data, "p.jsonl") == [
        "line 2, field 'prompt': empty prompt",
        "line 3: bad JSON: Expecting value at column 1",
        "line 4: expected a JSON object, got a list",
        "line 5, field 'messages': give either 'prompt' or 'messages', not both",
        "line 6, field 'prompt': expected a string, got a number",
        "line 6, field 'task': expected a string, got a number",
        "line 7, field 'messages': empty message list",
        "line 8, field 'messages[0].content': expected a string, got null",
        "line 9, field 'prompt': missing field: each line needs 'prompt' or 'messages'",
        "line 10, field 'id': expected a string or an integer, got a boolean",
    ]


def test_invalid_utf8_says_where_and_other_lines_are_still_checked():
    data = b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n{"prompt": ""}\n'
    assert issues_of(data, "p.jsonl") == [
        "line 2: invalid UTF-8 at column 16 (byte 0xe9)",
        "line 3, field 'prompt': empty prompt",
    ]


@pytest.mark.parametrize("filename", ["p.txt", "p.jsonl", "p.csv"])
def test_binary_empty_and_utf16_files(filename):
    assert issues_of(b"abc\ndef\x00ghi", filename) == [
        "line 2: binary content (NUL byte at column 4); expected a UTF-8 text file"
    ]
    assert issues_of(b"", filename) == ["file: file is empty"]
    assert issues_of(b" \n\r\n\t", filename) == ["file: file is empty"]
    assert issues_of("prompt\n".encode("utf-16"), filename) == [
        "file: file is UTF-16 encoded; save it as UTF-8"
    ]


def test_utf8_bom_is_accepted():
    parsed = parse_prompt_file(b"\xef\xbb\xbfprompt,task\nhello,qa\n", "p.csv")
    assert [(p.text, p.task) for p in parsed.prompts] == [("hello", "qa")]


def test_csv_missing_column_wrong_field_count_and_bad_quoting():
    assert issues_of(b"text,task\na,b\n", "p.csv") == [
        "line 1, field 'prompt': missing column 'prompt' in the header (found: text, task)"
    ]
    assert issues_of(b"prompt,prompt\na,b\n", "p.csv") == ["line 1: header repeats column(s): prompt"]
    assert issues_of(b'prompt,task\na,b,c\n,qa\n"open\n', "p.csv") == [
        "line 2: expected 2 fields as in the header, got 3",
        "line 3, field 'prompt': empty prompt",
        "line 4: bad CSV: unexpected end of data",
    ]


def test_limits_prompt_length_file_size_and_prompt_count():
    assert issues_of(b"short\n" + b"x" * 11 + b"\n", "p.txt", max_prompt_chars=10) == [
        "line 2, field 'prompt': prompt is 11 characters, over the limit of 10 (SPECROUTE_MAX_PROMPT_CHARS)"
    ]
    assert issues_of(b"a\n" * 10, "p.txt", max_bytes=19) == [
        "file: file is 20 bytes, over the limit of 19 (SPECROUTE_MAX_UPLOAD_BYTES)"
    ]
    data = "".join(f"p{i}\n" for i in range(6)).encode()
    assert issues_of(data, "p.txt", max_prompts=5) == [
        "line 6: more than 5 prompts (SPECROUTE_MAX_PROMPTS); split the file"
    ]


def test_error_list_is_capped_but_total_counted():
    data = b'{"prompt": ""}\n' * 120
    with pytest.raises(PromptFileError) as info:
        parse_prompt_file(data, "p.jsonl", limits=IngestLimits(max_reported_errors=50))
    assert info.value.total == 120 and len(info.value.issues) == 50
    assert info.value.report().splitlines()[0] == "p.jsonl: 120 errors; nothing was imported"
    assert info.value.report().splitlines()[-1] == "  ... and 70 more"


def test_duplicates_are_merged_and_reported_not_errors():
    parsed = parse_prompt_file(
        jsonl(
            {"prompt": "a", "task": "qa"},
            {"prompt": "b"},
            {"prompt": "a", "task": "code"},
            {"prompt": "a", "task": "qa"},
        ),
        "p.jsonl",
    )
    assert [p.text for p in parsed.prompts] == ["a", "b"]
    assert [str(d) for d in parsed.duplicates] == [
        "line 3: same prompt as line 1, merged; kept task 'qa' from line 1, dropped 'code'",
        "line 4: same prompt as line 1, merged",
    ]


def test_an_id_reused_for_a_different_prompt_is_an_error():
    assert issues_of(jsonl({"prompt": "a", "id": "1"}, {"prompt": "b", "id": 1}), "p.jsonl") == [
        "line 2, field 'id': id '1' is already used on line 1 by another prompt"
    ]


def test_lone_surrogate_escape_is_rejected():
    assert issues_of(b'{"prompt": "bad \\ud800 escape"}\n', "p.jsonl") == [
        "line 1, field 'prompt': contains an unpaired UTF-16 surrogate (invalid \\u escape)"
    ]


def test_unknown_extension_and_header_only_csv():
    assert issues_of(b"hello", "p.docx") == ["file: unsupported file type '.docx'; use .txt, .jsonl or .csv"]
    assert issues_of(b"prompt,task\n", "p.csv") == ["file: no prompts found"]


def test_text_quoted_from_an_undecodable_line_is_escaped():
    with pytest.raises(PromptFileError) as raised:
        parse_prompt_file(b"\x80bad,x\nhello,1\n", "bad.csv")
    messages = [issue.message for issue in raised.value.issues]
    assert any("\\udc80" in m for m in messages), messages
    for message in messages:
        message.encode("utf-8")  # printable and renderable: no lone surrogates
