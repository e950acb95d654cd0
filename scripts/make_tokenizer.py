#!/usr/bin/python3
"""Writes tokenizer.json, tokenizer_config.json and generation_config.json of the demo model.

Usage: /usr/bin/python3 scripts/make_tokenizer.py SOURCE_TOKENIZER_JSON OUT_DIR

SOURCE is llama2.c's 512-token SentencePiece BPE in Hugging Face form (MIT licence,
../shared/models/stories260K/tokenizer.json in this project's test setup). The vocabulary,
merges, normalizer and decoder are kept unchanged; two special tokens are added for the chat
template, with the next free ids:
    512 <|im_start|>    513 <|im_end|>    514 <|im_sep|>
so the model's vocab_size is 515. <|im_end|> is the eos token (it ends every assistant turn and
every text row of the pre-training corpus); </s> (2) stays a stop id in generation_config.json.
The chat template is ChatML with Phi-4's <|im_sep|> after the role, after a BOS:
    <s><|im_start|>user<|im_sep|>...<|im_end|><|im_start|>assistant<|im_sep|>...<|im_end|>
Why <|im_sep|> and no newlines: the normalizer puts "▁" before every piece of text between
special tokens, so a message's first word gets the same token as inside a sentence ("▁Tom", not
"T"+"om" after a newline); that makes copying words from the question easy for a tiny model, and
it saves the two tokens ("▁", <0x0A>) each newline costs in this vocabulary.
"""
import json
import os
import sys

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '<|im_sep|>' + message['content'] + '<|im_end|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant<|im_sep|>' }}{% endif %}")
ADDED = ["<|im_start|>", "<|im_end|>", "<|im_sep|>"]


def added_entry(idx, content):
    return {"id": idx, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": True}


def main():
    src, out = sys.argv[1], sys.argv[2]
    tok = json.load(open(src, encoding="utf-8"))
    vocab = tok["model"]["vocab"]
    first = max(vocab.values()) + 1
    assert first == 512, first
    existing = {a["content"] for a in tok["added_tokens"]}
    for k, content in enumerate(ADDED):
        if content not in existing:
            tok["added_tokens"].append(added_entry(first + k, content))
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, indent=1)
        f.write("\n")
    decoder = {str(a["id"]): {k: a[k] for k in ("content", "lstrip", "normalized", "rstrip", "single_word", "special")}
               for a in tok["added_tokens"]}
    config = {
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": "<s>",
        "eos_token": "<|im_end|>",
        "unk_token": "<unk>",
        "pad_token": "</s>",
        "additional_special_tokens": ADDED,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 512,
        "tokenizer_class": "LlamaTokenizer",
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": decoder,
    }
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)
        f.write("\n")
    gen = {"bos_token_id": 1, "eos_token_id": [first + 1, 2], "pad_token_id": 2}
    with open(os.path.join(out, "generation_config.json"), "w", encoding="utf-8") as f:
        json.dump(gen, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
