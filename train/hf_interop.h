// Hugging Face interop: a qkv checkpoint to a directory `transformers` loads with
// AutoModelForCausalLM.from_pretrained(DIR), and such a directory back to a qkv checkpoint.
//
// qkv's parameter names and stored layouts already are HF's (train/checkpoint.h), so the model
// maps one to one:
//   gpt2 family  <-> GPT2LMHeadModel (model_type "gpt2"): learned positions, LayerNorm, biases,
//                    multi-head attention (n_kv_head = n_head), activation gelu_tanh <-> "gelu_new"
//                    (also read: "gelu_pytorch_tanh"), gelu <-> "gelu", relu <-> "relu";
//                    tied or untied head (tie_word_embeddings).
//   llama family <-> LlamaForCausalLM (model_type "llama"): RoPE (rotate-half, rope_theta), RMSNorm,
//                    SwiGLU ("silu"), no biases, GQA (num_key_value_heads), tied or untied head.
//   llama family with a sliding window w <-> MistralForCausalLM (model_type "mistral"),
//                    sliding_window = w: the llama network whose key j is visible from position p
//                    iff p - w < j <= p, qkv's window rule and transformers' (masking_utils:
//                    kv_idx > q_idx - sliding_window). w is model.window, or the width l of
//                    attention_pattern = "window", or the narrower of both; sliding_window null
//                    reads as no window.
// Settings the HF class cannot express are refused by name, never written approximately: a
// sparse pattern (strided, global, bigbird, block_sparse) or linear attention for either family;
// for gpt2, any position but learned, rmsnorm, swiglu, no biases, GQA, a sliding window; for llama,
// any position but rope, layernorm, an activation but swiglu, biases; on import, a scaled RoPE,
// attention_bias, scale_attn_weights = false, cross-attention, a sliding_window in a llama (not
// mistral) config, and so on. Dropout and init_std are written but change no function; nor does
// "torch_dtype" (transformers 5: "dtype"): qkv computes in float32 whatever the file says.
// RoPE on import, as transformers 4 and 5 both write it: the base is the top-level "rope_theta"
// (4.x) or "rope_parameters"."rope_theta" (5.x; a legacy "rope_scaling" object in its place), 10000
// when none is given; "rope_type" (or "type") "default" is plain RoPE. A scaled type (linear,
// dynamic, yarn, longrope, llama3, ...), a partial_rotary_factor other than 1, a table per layer
// type or any other key there is refused naming "rope_parameters.KEY" (or "rope_scaling.KEY"), and
// two keys giving different bases are refused naming both: 4.x and 5.x would read different models.
// "layer_types" (5.x) must give every layer the attention the class gives it (full_attention, or
// sliding_attention for a Mistral with a window); "head_dim" must be hidden_size / heads.
//
// Export writes DIR atomically (a temporary directory renamed into place; DIR must not exist):
//   model.safetensors       the weights (float32 or bfloat16), __metadata__ {"format": "pt"}
//   config.json             GPT2Config / LlamaConfig fields (architectures, sizes, eps,
//                           rope_theta, heads, tie_word_embeddings, torch_dtype, bos/eos ids)
//   generation_config.json  bos/eos token ids
//   tokenizer               gpt2_bpe: vocab.json + merges.txt + tokenizer.json + tokenizer_config.json
//                           (GPT2Tokenizer, no prefix space; no special token is written as null,
//                           since an absent one makes GPT2Tokenizer add "<|endoftext|>") +
//                           special_tokens_map.json, which HF reproduces exactly. byte: the same
//                           files for a GPT-2 BPE of the 256 byte tokens (token b at id b) and no
//                           merge, which gives every text its bytes as ids in transformers 4 and 5.
//                           char and qkv's own bpe (its pre-split differs from GPT-2's, so no HF
//                           tokenizer gives its ids): qkv_tokenizer.json, a documented mapping
//                           {"format": "qkv-tokenizer-mapping", "kind", "id_to_bytes_hex": [hex of
//                           each id's bytes], "qkv": the tokenizer as qkv stores it}, not claimed as
//                           an HF tokenizer, and a tokenizer_config.json naming a class no
//                           transformers has, so that AutoTokenizer raises instead of building an
//                           empty tokenizer.
// Import reads config.json and model.safetensors, or the shards model-0000k-of-0000n.safetensors
// listed by model.safetensors.index.json; F32, F16, BF16 (and F64) become float32. Names may lack
// the head model's prefix ("wte.weight" for "transformer.wte.weight", as the original GPT-2 files
// have). HF's non-parameter buffers (gpt2 attn.bias / attn.masked_bias, llama rotary_emb.inv_freq),
// which transformers recomputes from config.json, are skipped; a tied model's lm_head.weight is
// accepted only when it equals the embedding bit for bit (a copy transformers saved), and refused
// naming the first differing element otherwise; any other tensor the model does not consume, a
// missing one or a wrong shape is an error naming it.
// The tokenizer must give every id a text: `--tokenizer byte` (a claim, not a file) needs exactly
// 256 rows; with DIR's own tokenizer files, rows past its tokens are padding (qkv's
// model.vocab_size may exceed the tokenizer's), which encode never produces and `qkv sample`
// never draws (train/sampler.h SampleOptions::token_count).
// pytorch_model.bin (a pickle: loading one can run arbitrary code) is refused.
// The tokenizer: DIR's tokenizer.json or vocab.json + merges.txt (GPT-2 byte-level BPE; exactly the
// 256 byte tokens in byte order with no merge is the byte tokenizer), else qkv_tokenizer.json (a
// qkv export), else `tokenizer = "byte"` when the caller says the ids are bytes. A tokenizer.json
// post_processor may be ByteLevel, a TemplateProcessing that adds no token (what transformers 5
// writes for GPT-2) or a Sequence of those; one that adds tokens is refused naming them.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "nn/transformer.h"
#include "train/config.h"

namespace qkv::train {

struct HfExportOptions {
  std::string dtype = "f32";  // "f32" | "bf16"
};
struct HfExportResult {
  std::string dir, architecture, dtype, tokenizer;  // tokenizer: "hf" (exact HF files) or "mapping"
  int64_t tensors = 0, parameters = 0, bytes = 0;
  std::vector<std::string> files;
};
HfExportResult export_hf(const std::string& checkpoint, const std::string& out_dir, const HfExportOptions& opts = {});

// What an HF directory holds, read and checked (weights not read yet).
struct HfModelInfo {
  std::string dir, architecture;
  Config config;  // the qkv config of the same network (resolved; data.tokenizer = the tokenizer's kind)
  std::vector<std::string> weight_files;
};
// Reads DIR/config.json; `tokenizer_kind` is what data.tokenizer will say, `tokenizer_vocab` the
// tokenizer's size (data.bpe_vocab_size of a qkv BPE; 0 = config.json's vocab_size).
HfModelInfo read_hf_config(const std::string& dir, TokenizerKind tokenizer_kind = TokenizerKind::byte,
                           int64_t tokenizer_vocab = 0);
// The tokenizer of DIR (rules above); `fallback` "byte" allows a directory without tokenizer
// files, "" refuses it naming the files looked for.
std::unique_ptr<Tokenizer> read_hf_tokenizer(const std::string& dir, const std::string& fallback = "");
// True when DIR holds tokenizer files read_hf_tokenizer reads.
bool has_hf_tokenizer(const std::string& dir);
// Loads DIR's weights into `model`, which must be the network DIR describes: every parameter
// present with HF's shape; names the first tensor at fault.
void load_hf_weights(const std::string& dir, nn::DecoderModel& model);

// DIR's network with its weights loaded (CPU, float32) and its tokenizer: DIR's files, or
// `tokenizer` = "byte" as a claim (import's --tokenizer, checked as described above). With
// `tokenizer_optional`, a DIR without tokenizer files (and no claim) gives a null tokenizer and
// config.json's vocab_size rows; otherwise that is refused naming the files looked for.
struct HfModel {
  std::string architecture;
  Config config;  // as read_hf_config gives it
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<nn::DecoderModel> model;
};
HfModel read_hf_model(const std::string& dir, const std::string& tokenizer = "", bool tokenizer_optional = false);

struct HfImportOptions {
  std::string tokenizer;  // "" (from DIR's files) or "byte"
};
struct HfImportResult {
  std::string checkpoint, architecture, tokenizer;
  int64_t tensors = 0, parameters = 0, vocab_size = 0;
};
// DIR -> a qkv checkpoint at `out` (step 0, no optimizer state), written atomically.
HfImportResult import_hf(const std::string& dir, const std::string& out, const HfImportOptions& opts = {});

// True for a directory holding config.json (what --init-from accepts beside a checkpoint).
bool is_hf_directory(const std::string& path);

}  // namespace qkv::train
