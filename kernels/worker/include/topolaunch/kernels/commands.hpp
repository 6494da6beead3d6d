// topolaunch-worker's commands beside training: `data prepare` (prepare.hpp), `sample` (text from
// a checkpoint, sampling.hpp) and `export` (a checkpoint as safetensors + config.json,
// interchange.hpp). Each takes its arguments after the command's name and returns the exit
// status (2: bad input, with one line on err naming the option or file).
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include "topolaunch/kernels/sampling.hpp"

namespace topolaunch::kernels {

int run_data_prepare(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);
// `cuda_decoder`: the CUDA backend's decoder of this program (linked_cuda_decoder()), or null.
int run_sample(const std::vector<std::string>& args, DecoderFactory cuda_decoder, std::ostream& out,
               std::ostream& err);
int run_export(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

extern const char* const kDataPrepareUsage;
extern const char* const kSampleUsage;
extern const char* const kExportUsage;

}  // namespace topolaunch::kernels
