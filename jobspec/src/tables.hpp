// One reader per table of the job file (launcher_tables.cpp, worker_tables.cpp). Private to
// jobspec: job_config.cpp calls them in file order.
#pragma once

#include "reader.hpp"
#include "topolaunch/jobspec/job_config.hpp"

namespace topolaunch::jobspec::detail {

void read_job(Reader& r, const toml::table& t, JobSection& job);
void read_mapping(Reader& r, const toml::table& t, topology::MappingSpec& spec);
void read_budget(Reader& r, const toml::table& t, BudgetSection& budget);
void read_rdma(Reader& r, const toml::table& t, RdmaSection& rdma);
void read_wireup(Reader& r, const toml::table& t, WireupSection& wireup);
void read_worker(Reader& r, const toml::table& t, WorkerSection& worker);
void read_observe(Reader& r, const toml::table& t, ObserveSection& observe);
void read_cost(Reader& r, const toml::table& t, CostSection& cost);

void read_model(Reader& r, const toml::table& t, ModelSpec& model);
void read_data(Reader& r, const toml::table& t, DataSpec& data);
void read_train(Reader& r, const toml::table& t, TrainSpec& train);
// The checks across [model] and [train] (seq_len within block_size, heads dividing the width,
// the padded vocabulary), once both are read. `model` and `train` are the tables as written
// (null when absent), for the error's position.
void check_model_and_train(Reader& r, const toml::table* model, const toml::table* train,
                           const ModelSpec& spec, const TrainSpec& train_spec);
// [observe] against the rest: trace_steps within the built-in worker's train.steps (and only with
// a [model]), metrics_port apart from wireup.port. `observe` as written (null when absent).
void check_observe(Reader& r, const toml::table* observe, const JobConfig& config);
// job.start = "early" against the rest: no [rdma] preflight, no switch-tree node order. The
// tables as written (null when absent); the error is at job.start.
void check_start(Reader& r, const toml::table* job, const toml::table* mapping,
                 const toml::table* rdma, const JobConfig& config);

}  // namespace topolaunch::jobspec::detail
