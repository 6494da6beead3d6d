// A trained model outside topolaunch and back: safetensors files with Hugging Face GPT-2 tensor
// names plus config.json (what transformers.GPT2LMHeadModel.from_pretrained(dir) and a plain
// PyTorch GPT-2 load), and the files beside the checkpoints that make them self-describing
// (model.json: the model's shape; tokenizer.model: the tokenizer of its data).
//
// safetensors: an 8-byte little-endian header length N, N bytes of JSON ({"name": {"dtype",
// "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}), then the data. The reader takes
// an untrusted file: a length past the file, JSON that does not parse, an unknown dtype, a shape
// whose size is not its byte range, a range outside the data: each one line naming the file and
// the tensor (exit 2).
//
// Names: ours -> Hugging Face's (GPT2Model's, without the "transformer." prefix that
// GPT2LMHeadModel's state dict has; the importer takes both): wte -> wte.weight (our padded rows
// dropped: [vocab, C]), wpe -> wpe.weight, h<i>.ln1w/ln1b -> h.<i>.ln_1.weight/bias, h<i>.qkvw ->
// h.<i>.attn.c_attn.weight, ... Our matrices are nn.Linear's [out, in]; GPT-2's Conv1D keeps
// [in, out], so every block matrix is transposed on the way out and back.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "topolaunch/common/result.hpp"
#include "topolaunch/kernels/checkpoint.hpp"
#include "topolaunch/kernels/graph.hpp"
#include "topolaunch/kernels/weights.hpp"

namespace topolaunch::kernels {

struct NamedTensor {
  std::string name;
  std::vector<std::int64_t> shape;
  std::vector<float> values;
};

// Writes F32 tensors in the order given (to a temporary name, renamed into place).
Status write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                         const std::map<std::string, std::string>& metadata = {});
// F32, F16 and BF16 tensors, as fp32, in file order.
Result<std::vector<NamedTensor>> read_safetensors(const std::string& path);

// Our parameters as Hugging Face GPT-2 tensors, and its config.json for the shape.
std::vector<NamedTensor> to_hf_gpt2(const GptConfig& config, const NamedWeights& weights);
std::string hf_gpt2_config_json(const GptConfig& config);
// dir/model.safetensors (+ dir/config.json when present: its shape must be `config`'s) as our
// parameters for `config` (wte padded to the padded vocabulary with zero rows). A missing, extra
// or wrongly shaped tensor is an error naming it and both shapes (exit 2).
Result<NamedWeights> from_hf_gpt2(const std::string& dir, const GptConfig& config);
// Writes dir/model.safetensors, dir/config.json (and copies tokenizer, when given, to
// dir/tokenizer.model).
Status export_hf_gpt2(const std::string& dir, const GptConfig& config, const NamedWeights& weights,
                      const std::string& tokenizer);

// The model beside its checkpoints: dir/model.json (kind, layers, widths, context, vocabulary,
// padded vocabulary; newline_token: the tokenizer's "<nl>" when it was known).
struct ModelDescription {
  GptConfig config;
  std::int32_t newline_token = -1;
};
Status write_model_description(const std::string& dir, const ModelDescription& model);
Result<ModelDescription> read_model_description(const std::string& dir);
// dir/tokenizer.model
std::string tokenizer_beside(const std::string& dir);
// What the training loop leaves beside its checkpoints: model.json, and the tokenizer (when the
// job names one) copied to dir/tokenizer.model.
Status describe_checkpoint_dir(const std::string& dir, const ModelDescription& model,
                               const std::string& tokenizer);
// [train] init_from: the parameters of `graph` from dir (from_hf_gpt2), stored through `write`
// (the executor's checkpoint writer; optimizer state stays as it is: zero).
Status load_initial_weights(
    const std::string& dir, const GptConfig& config, const Graph& graph,
    const std::function<Status(const CheckpointEntry&, std::span<const float>)>& write);

// The parameters of a checkpoint of `config`: `path` a checkpoint file, or a checkpoint folder
// (its newest good generation). Returns them with the path loaded.
Result<std::pair<std::string, NamedWeights>> load_checkpoint_weights(const std::string& path,
                                                                     const GptConfig& config);

}  // namespace topolaunch::kernels
