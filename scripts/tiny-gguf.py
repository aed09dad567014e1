#!/usr/bin/env python3
"""Writes a tiny llama-architecture GGUF model with random weights and a
real tokenizer vocabulary, for running llama-server in tests on a CPU.

The weights are random, so the model's text is noise; what the tests need
from it is real: a real tokenizer (the vocabulary is copied from one of the
vocab-only GGUF files that llama.cpp's source tree carries under models/),
a real prefill and decode on llama.cpp's kernels, and a real KV cache that
llama-server reuses across requests and reports as cached tokens.

Usage: tiny-gguf.py VOCAB.gguf OUT.gguf   (gguf-py on PYTHONPATH, numpy)
"""

import sys

import numpy as np

import gguf

# Big enough that a prompt of a few thousand tokens takes a measurable
# prefill on one CPU core (attention grows with the square of the prompt),
# small enough (about 10 MB) that two replicas start in well under a second.
N_EMBD = 128
N_LAYER = 4
N_HEAD = 4
N_FF = 384
N_CTX = 32768

# A zephyr-style template: plain text, so it needs no special tokens in the
# vocabulary, and llama.cpp's template engine renders it as written.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def main() -> None:
    vocab_path, out_path = sys.argv[1], sys.argv[2]
    vocab = gguf.GGUFReader(vocab_path)
    tokens = vocab.fields["tokenizer.ggml.tokens"]
    n_vocab = len(tokens.data)

    w = gguf.GGUFWriter(out_path, "llama")
    w.add_name("warmroute-tiny")
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD)
    w.add_rope_dimension_count(N_EMBD // N_HEAD)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)

    # The tokenizer: every tokenizer.* key of the vocabulary file, as it is.
    for key, field in vocab.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            sub = field.types[-1]
            if sub == gguf.GGUFValueType.STRING:
                val = [bytes(field.parts[i]) for i in field.data]
            else:
                val = [field.parts[i].tolist()[0] for i in field.data]
            w.add_key_value(key, val, vtype, sub_type=sub)
        elif vtype == gguf.GGUFValueType.STRING:
            w.add_key_value(key, bytes(field.parts[field.data[0]]).decode(), vtype)
        else:
            w.add_key_value(key, field.parts[field.data[0]].tolist()[0], vtype)
    w.add_chat_template(CHAT_TEMPLATE)

    rng = np.random.default_rng(1)

    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float16)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    w.add_tensor("token_embd.weight", mat(n_vocab, N_EMBD))
    w.add_tensor("output_norm.weight", ones(N_EMBD))
    for i in range(N_LAYER):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", ones(N_EMBD))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            w.add_tensor(p + name + ".weight", mat(N_EMBD, N_EMBD))
        w.add_tensor(p + "ffn_norm.weight", ones(N_EMBD))
        w.add_tensor(p + "ffn_gate.weight", mat(N_FF, N_EMBD))
        w.add_tensor(p + "ffn_up.weight", mat(N_FF, N_EMBD))
        w.add_tensor(p + "ffn_down.weight", mat(N_EMBD, N_FF))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
