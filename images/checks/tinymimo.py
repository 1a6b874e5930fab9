"""A tiny random-init MiMo with one MTP layer, its tokenizer and a chat data set, made at test
time (nothing from a hub) for trainer_check.py, and the prompt data set of rl_check.py.

MiMo-7B-RL is Qwen2 (bias on q/k/v, untied head) plus `num_nextn_predict_layers` MTP layers;
transformers has no `mimo` model type, so the folder carries its own configuration_mimo.py
(loaded with trust_remote_code). Its MTP tensors are the names Megatron-Bridge's MimoBridge maps
(megatron/bridge/models/mimo/mimo_bridge.py at 51885cf1). The weights are written as bf16
safetensors by the standard library alone (the format is a JSON header and raw bytes), so the
model is byte-identical for a seed and its making is tested without torch; the tokenizer needs
the `tokenizers` package and the data set `pyarrow`, both in every image.

SGLang serves the same folder: its MiMoForCausalLM (sglang/srt/models/mimo.py at 0.5.12) loads the
trunk and skips `model.mtp_layers.*`; as an EAGLE draft, SGLang renames the architecture to MiMoMTP
(srt/configs/model_config.py, _config_draft_model), whose loader maps `model.mtp_layers.0.*` onto
its one MTP layer (models/mimo_mtp.py, map_model_name_to_mtp_param_name): the tensor names here
are those. With verl's rollout defaults (skip_tokenizer_init, load_format dummy) SGLang reads only
config.json (through configuration_mimo.py) and takes the weights from the trainer.
"""

from __future__ import annotations

import array
import json
import random
import struct
from pathlib import Path

MODEL = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1024,
    "num_nextn_predict_layers": 1,
    "max_position_embeddings": 32768,  # what MiMo-7B-RL needs for verl's RL example
}
MTP_PREFIX = "model.mtp_layers."
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
EOS, PAD = "<|im_end|>", "<|endoftext|>"
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CONFIGURATION_MIMO = '''"""MiMo's configuration for a test model: Qwen2's, plus its MTP layer count."""

from transformers import Qwen2Config


class MiMoConfig(Qwen2Config):
    model_type = "mimo"

    def __init__(self, num_nextn_predict_layers=0, **kwargs):
        self.num_nextn_predict_layers = num_nextn_predict_layers
        super().__init__(**kwargs)
'''
ROWS = 256
RL_ROWS = 64
RL_SOURCE = "mtp-check/sums"
INIT_STD = 0.02


def tensor_shapes() -> dict[str, tuple[int, ...]]:
    """Every tensor of the checkpoint, in a fixed order: 27 of the trunk, 16 per MTP layer."""
    h, i, v = MODEL["hidden_size"], MODEL["intermediate_size"], MODEL["vocab_size"]
    kv = h // MODEL["num_attention_heads"] * MODEL["num_key_value_heads"]

    def block(prefix: str) -> dict[str, tuple[int, ...]]:
        return {
            f"{prefix}input_layernorm.weight": (h,),
            f"{prefix}post_attention_layernorm.weight": (h,),
            f"{prefix}self_attn.q_proj.weight": (h, h),
            f"{prefix}self_attn.q_proj.bias": (h,),
            f"{prefix}self_attn.k_proj.weight": (kv, h),
            f"{prefix}self_attn.k_proj.bias": (kv,),
            f"{prefix}self_attn.v_proj.weight": (kv, h),
            f"{prefix}self_attn.v_proj.bias": (kv,),
            f"{prefix}self_attn.o_proj.weight": (h, h),
            f"{prefix}mlp.gate_proj.weight": (i, h),
            f"{prefix}mlp.up_proj.weight": (i, h),
            f"{prefix}mlp.down_proj.weight": (h, i),
        }

    shapes = {"model.embed_tokens.weight": (v, h)}
    for n in range(MODEL["num_hidden_layers"]):
        shapes.update(block(f"model.layers.{n}."))
    shapes["model.norm.weight"] = (h,)
    shapes["lm_head.weight"] = (v, h)
    for n in range(MODEL["num_nextn_predict_layers"]):
        p = f"{MTP_PREFIX}{n}."
        shapes.update(block(p))
        shapes[f"{p}token_layernorm.weight"] = (h,)
        shapes[f"{p}hidden_layernorm.weight"] = (h,)
        shapes[f"{p}input_proj.weight"] = (h, 2 * h)
        shapes[f"{p}final_layernorm.weight"] = (h,)
    return shapes


def _count(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def bf16_bytes(values) -> bytes:
    """float values as little-endian bfloat16 (the top half of each float32, truncated)."""
    bits = array.array("I")
    bits.frombytes(array.array("f", values).tobytes())
    return array.array("H", (b >> 16 for b in bits)).tobytes()


def init_values(name: str, n: int, rng: random.Random) -> list[float]:
    if name.endswith("norm.weight"):
        return [1.0] * n
    if name.endswith(".bias"):
        return [0.0] * n
    return [rng.gauss(0.0, INIT_STD) for _ in range(n)]


def write_safetensors(path: Path, tensors: dict[str, tuple[tuple[int, ...], bytes]]) -> None:
    """name -> (shape, bf16 bytes), as the safetensors format lays them out."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, (shape, data) in tensors.items():
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        for _, data in tensors.values():
            f.write(data)


def read_safetensors(path: Path) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    """name -> (dtype, shape, raw bytes)."""
    raw = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    body = raw[8 + n :]
    return {
        k: (v["dtype"], tuple(v["shape"]), body[v["data_offsets"][0] : v["data_offsets"][1]])
        for k, v in header.items()
        if k != "__metadata__"
    }


def as_float32_bits(dtype: str, data: bytes) -> array.array:
    """A tensor's values as float32 bit patterns, so bf16 and fp32 exports compare exactly."""
    if dtype == "BF16":
        half = array.array("H")
        half.frombytes(data)
        return array.array("I", (h << 16 for h in half))
    if dtype == "F32":
        out = array.array("I")
        out.frombytes(data)
        return out
    raise ValueError(f"unexpected dtype {dtype}")


def corpus_rows(n: int = ROWS) -> list[list[dict]]:
    """Chat rows in verl's `messages` format: sums written out, learnable in a few steps."""
    words = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    rows = []
    for i in range(n):
        a, b = i % 10, (i * 7 + 3) % 10
        s = a + b
        total = words[s] if s < 10 else f"one {words[s - 10]}"
        rows.append(
            [
                {"role": "user", "content": f"What is {words[a]} plus {words[b]}?"},
                {"role": "assistant", "content": f"{words[a]} plus {words[b]} is {total}."},
            ]
        )
    return rows


def make_tokenizer(model_dir: Path, rows: list[list[dict]]) -> dict[str, int]:
    """A byte-level BPE trained on the rows, saved as transformers' fast tokenizer files;
    returns the ids of the special tokens and the vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=MODEL["vocab_size"],
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(
        [m["content"] for row in rows for m in row] + ["user assistant system\n"], trainer
    )
    tok.save(str(model_dir / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS,
        "pad_token": PAD,
        "model_max_length": MODEL["max_position_embeddings"],
        "chat_template": CHATML,
        "clean_up_tokenization_spaces": False,
    }
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    (model_dir / "special_tokens_map.json").write_text(
        json.dumps({"eos_token": EOS, "pad_token": PAD}, indent=2)
    )
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    return {**ids, "vocab": tok.get_vocab_size()}


def config_json(ids: dict[str, int]) -> dict:
    return {
        "architectures": ["MiMoForCausalLM"],
        "model_type": "mimo",
        "auto_map": {"AutoConfig": "configuration_mimo.MiMoConfig"},
        **MODEL,
        "head_dim": MODEL["hidden_size"] // MODEL["num_attention_heads"],
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "initializer_range": INIT_STD,
        "torch_dtype": "bfloat16",
        "bos_token_id": ids[EOS],
        "eos_token_id": ids[EOS],
        "pad_token_id": ids[PAD],
    }


def make_data(data_dir: Path, rows: list[list[dict]]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / "train.parquet"
    pq.write_table(pa.Table.from_pylist([{"messages": r} for r in rows]), path)
    return path


def rl_rows(n: int = RL_ROWS) -> list[dict]:
    """Prompts in verl's RL data set format (RLHFDataset: `prompt` as chat messages, and what the
    reward manager reads: `data_source`, `reward_model.ground_truth`, `extra_info`)."""
    out = []
    for i, (user, assistant) in enumerate(corpus_rows(n)):
        out.append(
            {
                "data_source": RL_SOURCE,
                "prompt": [user],
                "ability": "arithmetic",
                "reward_model": {"style": "rule", "ground_truth": assistant["content"]},
                "extra_info": {"index": i, "split": "train"},
            }
        )
    return out


def make_rl_data(data_dir: Path, rows: list[dict] | None = None) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / "rl.parquet"
    pq.write_table(pa.Table.from_pylist(rows if rows is not None else rl_rows()), path)
    return path


def make(work: Path, seed: int = 1234) -> Path:
    """work/model (config, configuration_mimo.py, tokenizer, bf16 safetensors),
    work/data/train.parquet (chat rows) and work/data/rl.parquet (prompts); returns the model folder."""
    model_dir = work / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    rows = corpus_rows()
    ids = make_tokenizer(model_dir, rows)
    if ids["vocab"] > MODEL["vocab_size"]:
        raise ValueError(f"tokenizer vocabulary {ids['vocab']} exceeds the model's {MODEL['vocab_size']}")
    (model_dir / "config.json").write_text(json.dumps(config_json(ids), indent=2, sort_keys=True))
    (model_dir / "configuration_mimo.py").write_text(CONFIGURATION_MIMO)
    # token ids only (no sampling defaults): SGLang and transformers look for the file and say so
    gen = {k: config_json(ids)[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    (model_dir / "generation_config.json").write_text(json.dumps(gen, indent=2, sort_keys=True))
    rng = random.Random(seed)
    tensors = {
        name: (shape, bf16_bytes(init_values(name, _count(shape), rng)))
        for name, shape in tensor_shapes().items()
    }
    write_safetensors(model_dir / "model.safetensors", tensors)
    make_data(work / "data", rows)
    make_rl_data(work / "data")
    return model_dir


def compare_export(initial: Path, ckpt: Path) -> dict | None:
    """The exported HF checkpoint (model/huggingface/*.safetensors under a run's checkpoint
    folder) against the initial weights: MTP and trunk tensors unchanged, changed, missing."""
    files = sorted(p for p in Path(ckpt).rglob("*.safetensors") if "huggingface" in p.parts)
    if not files:
        return None
    exported: dict[str, tuple[str, tuple[int, ...], bytes]] = {}
    for f in files:
        exported.update(read_safetensors(f))
    out = {"mtp": {"same": 0, "changed": 0, "missing": 0}, "trunk": {"same": 0, "changed": 0, "missing": 0}}
    for name, (dtype, shape, data) in read_safetensors(initial).items():
        part = out["mtp" if name.startswith(MTP_PREFIX) else "trunk"]
        if name not in exported:
            part["missing"] += 1
            continue
        edtype, eshape, edata = exported[name]
        same = eshape == shape and as_float32_bits(dtype, data) == as_float32_bits(edtype, edata)
        part["same" if same else "changed"] += 1
    return out
