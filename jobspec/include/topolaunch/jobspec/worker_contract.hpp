// The worker contract: what the starters of a worker (the agent of `topolaunch run`, the SPANK
// plugin under plain srun) and the workers themselves (topolaunch-worker on CPU or GPU, or any
// program, e.g. a torchrun-style script) agree on: the environment, the exit statuses and the
// heartbeat. Everything here is spelled once; the launcher, the plugin and the workers use these
// names. The rank map (topology, a floor below) writes the names of its per-rank environment
// itself; tests/unit/launcher/test_worker_env.cpp holds them to kWorkerVariables.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "topolaunch/common/env.hpp"
#include "topolaunch/common/result.hpp"

namespace topolaunch::jobspec {

// ---- The environment ---------------------------------------------------------------------
namespace env {
// torchrun's names, so that a torch.distributed program runs unchanged.
inline constexpr const char* kRank = "RANK";
inline constexpr const char* kLocalRank = "LOCAL_RANK";
inline constexpr const char* kWorldSize = "WORLD_SIZE";
inline constexpr const char* kLocalWorldSize = "LOCAL_WORLD_SIZE";
inline constexpr const char* kGroupRank = "GROUP_RANK";
inline constexpr const char* kGroupWorldSize = "GROUP_WORLD_SIZE";
inline constexpr const char* kRoleRank = "ROLE_RANK";
inline constexpr const char* kRoleName = "ROLE_NAME";
inline constexpr const char* kRoleWorldSize = "ROLE_WORLD_SIZE";
inline constexpr const char* kMasterAddr = "MASTER_ADDR";
inline constexpr const char* kMasterPort = "MASTER_PORT";
inline constexpr const char* kRestartCount = "TORCHELASTIC_RESTART_COUNT";
inline constexpr const char* kMaxRestarts = "TORCHELASTIC_MAX_RESTARTS";
inline constexpr const char* kRunIdTorchelastic = "TORCHELASTIC_RUN_ID";
inline constexpr const char* kOmpNumThreads = "OMP_NUM_THREADS";
// Where torch.distributed.elastic's @record writes the exception and traceback of a failed rank
// (JSON); the agent reads it after the rank failed.
inline constexpr const char* kErrorFile = "TORCHELASTIC_ERROR_FILE";
// "False": torch's env:// rendezvous must not expect a store hosted by the agent (rank 0 hosts
// torch's TCPStore on MASTER_PORT).
inline constexpr const char* kUseAgentStore = "TORCHELASTIC_USE_AGENT_STORE";
// "1" unless the user set them, as torchrun does: NCCL errors and timeouts abort the process
// instead of hanging it (torch < 2.2 reads the first name, later ones the second).
inline constexpr const char* kNcclAsyncErrorHandling = "NCCL_ASYNC_ERROR_HANDLING";
inline constexpr const char* kTorchNcclAsyncErrorHandling = "TORCH_NCCL_ASYNC_ERROR_HANDLING";
// Slurm's task names, per rank, when the job runs under Slurm (the agent is itself a Slurm
// task, so the values it inherited describe the agent, not the worker).
inline constexpr const char* kSlurmProcid = "SLURM_PROCID";
inline constexpr const char* kSlurmLocalid = "SLURM_LOCALID";
inline constexpr const char* kSlurmNtasks = "SLURM_NTASKS";
inline constexpr const char* kSlurmNprocs = "SLURM_NPROCS";
inline constexpr const char* kSlurmNodeid = "SLURM_NODEID";
// Open MPI (4.x): where a singleton (an MPI program started without an MPI launcher) finds its
// server. The agent points it at a file that never exists when WORLD_SIZE > 1, so MPI_Init of
// such a rank fails at once instead of computing as a one-process job; the path, which Open MPI
// prints, is how the agent recognises the failure (kMpiSingletonMarker).
inline constexpr const char* kOmpiSingletonServer = "OMPI_MCA_ess_singleton_server";
// The name of that file (in the attempt's directory, never created).
inline constexpr const char* kMpiSingletonMarker = "topolaunch-run-is-not-an-mpi-launcher";
// Ours.
inline constexpr const char* kTopolaunchRank = "TOPOLAUNCH_RANK";
inline constexpr const char* kTopolaunchWorldSize = "TOPOLAUNCH_WORLD_SIZE";
inline constexpr const char* kTopolaunchLocalRank = "TOPOLAUNCH_LOCAL_RANK";
inline constexpr const char* kNodeRank = "TOPOLAUNCH_NODE_RANK";
inline constexpr const char* kWireup = "TOPOLAUNCH_WIREUP";
inline constexpr const char* kStoreAddr = "TOPOLAUNCH_STORE_ADDR";      // wireup/tcp_store.hpp
inline constexpr const char* kStoreSecret = "TOPOLAUNCH_STORE_SECRET";  // wireup/tcp_store.hpp
inline constexpr const char* kRankmapFile = "TOPOLAUNCH_RANKMAP_FILE";
inline constexpr const char* kConfig = "TOPOLAUNCH_CONFIG";
inline constexpr const char* kJobDir = "TOPOLAUNCH_JOB_DIR";
inline constexpr const char* kCheckpointDir = "TOPOLAUNCH_CHECKPOINT_DIR";
inline constexpr const char* kHeartbeatFile = "TOPOLAUNCH_HEARTBEAT_FILE";
inline constexpr const char* kAttempt = "TOPOLAUNCH_ATTEMPT";
inline constexpr const char* kRunId = "TOPOLAUNCH_RUN_ID";
inline constexpr const char* kNumaNode = "TOPOLAUNCH_NUMA_NODE";
// [observe]: where the rank writes the timeline of observe.trace_steps (Chrome trace JSON), and
// the JSON lines of step figures the agent reads for report.json and its metrics endpoint
// (docs/observe.md gives the format; any worker may write them).
inline constexpr const char* kTraceFile = "TOPOLAUNCH_TRACE_FILE";
inline constexpr const char* kStepMetricsFile = "TOPOLAUNCH_STEP_METRICS_FILE";
// The rank map's (topology/src/rankmap/rankmap.cpp writes them).
inline constexpr const char* kCudaVisibleDevices = "CUDA_VISIBLE_DEVICES";
inline constexpr const char* kCudaDeviceOrder = "CUDA_DEVICE_ORDER";
inline constexpr const char* kGpuBusids = "TOPOLAUNCH_GPU_BUSIDS";
inline constexpr const char* kGpuPcieGbytesPerS = "TOPOLAUNCH_GPU_PCIE_GBYTES_PER_S";
inline constexpr const char* kNics = "TOPOLAUNCH_NICS";
inline constexpr const char* kNcclIbHca = "NCCL_IB_HCA";
inline constexpr const char* kUcxNetDevices = "UCX_NET_DEVICES";
inline constexpr const char* kTpRank = "TOPOLAUNCH_TP_RANK";
inline constexpr const char* kPpRank = "TOPOLAUNCH_PP_RANK";
inline constexpr const char* kDpRank = "TOPOLAUNCH_DP_RANK";
inline constexpr const char* kTpSize = "TOPOLAUNCH_TP_SIZE";
inline constexpr const char* kPpSize = "TOPOLAUNCH_PP_SIZE";
inline constexpr const char* kDpSize = "TOPOLAUNCH_DP_SIZE";
inline constexpr const char* kCpus = "TOPOLAUNCH_CPUS";
inline constexpr const char* kNuma = "TOPOLAUNCH_NUMA";
// The SPANK plugin's.
inline constexpr const char* kNode = "TOPOLAUNCH_NODE";
inline constexpr const char* kBoundCpus = "TOPOLAUNCH_BOUND_CPUS";
inline constexpr const char* kMode = "TOPOLAUNCH_MODE";
// Read by topolaunch-worker only: "ucx" or "tcp" forces its CPU gradient communicator.
inline constexpr const char* kKernelsComm = "TOPOLAUNCH_KERNELS_COMM";
}  // namespace env

// Who sets a variable of the contract.
enum WorkerVariableSource : unsigned {
  kSetByAgent = 1u << 0,   // the agent of `topolaunch run` itself (launcher/src/worker_env.cpp)
  kSetByPlugin = 1u << 1,  // the SPANK plugin itself (spank_plugin/src/node_plan.cpp, remote.cpp)
  kFromRankMap = 1u << 2,  // the rank map's per-rank environment, which both pass on
  kSetByUser = 1u << 3,    // nobody but the user
  kSetByAgentUnderSlurm = 1u << 4,  // the agent, when the job runs under Slurm (SLURM_JOB_ID)
};

struct WorkerVariable {
  const char* name;
  unsigned set_by;      // WorkerVariableSource bits
  const char* meaning;  // for people (docs/architecture.md shows the same table)
};

inline constexpr WorkerVariable kWorkerVariables[] = {
    {env::kRank, kSetByAgent | kSetByPlugin | kFromRankMap, "global rank"},
    {env::kLocalRank, kSetByAgent | kSetByPlugin | kFromRankMap, "rank on this node"},
    {env::kWorldSize, kSetByAgent | kSetByPlugin | kFromRankMap, "number of ranks"},
    {env::kLocalWorldSize, kSetByAgent | kSetByPlugin | kFromRankMap, "ranks on this node"},
    {env::kGroupRank, kSetByAgent | kSetByPlugin | kFromRankMap, "node index"},
    {env::kGroupWorldSize, kSetByAgent | kFromRankMap, "number of nodes"},
    {env::kRoleRank, kSetByAgent, "global rank (one role)"},
    {env::kRoleName, kSetByAgent, "\"default\""},
    {env::kRoleWorldSize, kSetByAgent, "number of ranks (one role)"},
    {env::kMasterAddr, kSetByAgent | kSetByPlugin, "node 0's address, for torch's TCPStore"},
    {env::kMasterPort, kSetByAgent | kSetByPlugin, "a free port there"},
    {env::kRestartCount, kSetByAgent, "attempt number, 0 first"},
    {env::kMaxRestarts, kSetByAgent, "[job] restarts"},
    {env::kRunIdTorchelastic, kSetByAgent, "the run id"},
    {env::kOmpNumThreads, kSetByAgent | kFromRankMap, "the rank's cores (unless the user set it)"},
    {env::kErrorFile, kSetByAgent, "<job_dir>/attempt-N/error/rank-R.json, for @record"},
    {env::kUseAgentStore, kSetByAgent, "\"False\": rank 0 hosts torch's store"},
    {env::kNcclAsyncErrorHandling, kSetByAgent, "\"1\" unless the user set it"},
    {env::kTorchNcclAsyncErrorHandling, kSetByAgent, "\"1\" unless the user set it"},
    {env::kSlurmProcid, kSetByAgentUnderSlurm, "global rank"},
    {env::kSlurmLocalid, kSetByAgentUnderSlurm, "rank on this node"},
    {env::kSlurmNtasks, kSetByAgentUnderSlurm, "number of ranks"},
    {env::kSlurmNprocs, kSetByAgentUnderSlurm, "number of ranks (Slurm's older name)"},
    {env::kSlurmNodeid, kSetByAgentUnderSlurm, "node index"},
    {env::kOmpiSingletonServer, kSetByAgent,
     "a file that never exists, with WORLD_SIZE > 1: Open MPI refuses singletons"},
    {env::kCudaVisibleDevices, kFromRankMap, "the rank's GPUs (when it has any)"},
    {env::kCudaDeviceOrder, kFromRankMap, "\"PCI_BUS_ID\" (with CUDA_VISIBLE_DEVICES)"},
    {env::kGpuBusids, kFromRankMap, "the rank's GPUs' PCI bus ids"},
    {env::kGpuPcieGbytesPerS, kFromRankMap,
     "its GPUs' slowest PCIe link, GB/s each way (when the topology says)"},
    {env::kNics, kFromRankMap, "the rank's NICs (when it has any)"},
    {env::kNcclIbHca, kFromRankMap, "=nic:port,... ([mapping] pin_nics)"},
    {env::kUcxNetDevices, kFromRankMap, "nic:port,... ([mapping] pin_nics)"},
    {env::kTpRank, kFromRankMap, "tensor-parallel coordinate"},
    {env::kPpRank, kFromRankMap, "pipeline-parallel coordinate"},
    {env::kDpRank, kFromRankMap, "data-parallel coordinate"},
    {env::kTpSize, kFromRankMap, "[mapping] tensor"},
    {env::kPpSize, kFromRankMap, "[mapping] pipeline"},
    {env::kDpSize, kFromRankMap, "data-parallel size"},
    {env::kCpus, kSetByAgent | kSetByPlugin | kFromRankMap, "the rank's CPUs (a list)"},
    {env::kNuma, kFromRankMap, "the rank's NUMA node ([mapping] bind_memory, NUMA hosts)"},
    {env::kTopolaunchRank, kSetByAgent, "global rank"},
    {env::kTopolaunchWorldSize, kSetByAgent, "number of ranks"},
    {env::kTopolaunchLocalRank, kSetByAgent, "rank on this node"},
    {env::kNodeRank, kSetByAgent, "node index"},
    {env::kNumaNode, kSetByAgent, "the rank's NUMA node"},
    {env::kWireup, kSetByAgent, "\"tcp\": the workers' KV store backend"},
    {env::kStoreAddr, kSetByAgent, "host:port of the workers' TCP store"},
    {env::kStoreSecret, kSetByAgent, "its per-job secret"},
    {env::kRankmapFile, kSetByAgent, "the rank map (JSON)"},
    {env::kConfig, kSetByAgent, "the job file, absolute"},
    {env::kJobDir, kSetByAgent, "the job directory, absolute"},
    {env::kCheckpointDir, kSetByAgent, "where checkpoints go ([job] checkpoint_dir)"},
    {env::kHeartbeatFile, kSetByAgent, "this rank's heartbeat file (see HeartbeatWriter)"},
    {env::kAttempt, kSetByAgent, "attempt number, 0 first"},
    {env::kRunId, kSetByAgent, "the run id"},
    {env::kTraceFile, kSetByAgent, "<job_dir>/attempt-N/trace/rank-R.json ([observe] trace_steps)"},
    {env::kStepMetricsFile, kSetByAgent,
     "<job_dir>/attempt-N/metrics/rank-R.jsonl: step figures the agent reads"},
    {env::kNode, kSetByPlugin, "the Slurm node name"},
    {env::kBoundCpus, kSetByPlugin, "the CPUs the task was bound to"},
    {env::kMode, kSetByPlugin, "the --topolaunch= mode"},
    {env::kKernelsComm, kSetByUser, "topolaunch-worker's CPU communicator: \"ucx\" or \"tcp\""},
};

// Where a worker is in the job, from its environment: TOPOLAUNCH_RANK / TOPOLAUNCH_WORLD_SIZE /
// TOPOLAUNCH_LOCAL_RANK where set (the agent sets both kinds), else torchrun's RANK /
// WORLD_SIZE / LOCAL_RANK, else a single process. Every one of these that is set must be a
// well-formed integer (an error naming it and its value, exit 2, e.g. "LOCAL_RANK=1x: not an
// integer"), and the rank must be below the world size.
struct WorkerPlace {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
};
Result<WorkerPlace> worker_place(const Environment& env);

// ---- Exit statuses -----------------------------------------------------------------------
namespace exit_status {
// Of a worker (topolaunch-worker; other workers are asked to follow them).
inline constexpr int kDone = 0;      // finished train.steps
inline constexpr int kFailed = 1;    // runtime failure (I/O, CUDA, NCCL)
inline constexpr int kBadInput = 2;  // job file, data, checkpoint, environment, budget refused
// A peer rank died, stopped answering in a collective, or failed what all ranks wait for (rank
// 0's checkpoint write): a consequence, the root cause is that peer. Distinct from every status of
// `topolaunch run` (3 is its requeue).
inline constexpr int kPeerFailed = 4;
inline constexpr int kRequeue = 75;      // EX_TEMPFAIL: SIGUSR1, checkpointed at a step boundary
inline constexpr int kTerminated = 143;  // 128 + SIGTERM: checkpointed at a step boundary
// Of `topolaunch run` (and of each `topolaunch agent`): 0 every worker exited 0, 1 the job
// failed (restarts used up), 2 bad input (nothing was left running), 3 stopped for requeue
// (SIGUSR1 forwarded, workers checkpointed; an sbatch script can `scontrol requeue`), and
// 128 + N stopped by signal N.
inline constexpr int kJobRequeue = 3;
inline constexpr int kJobSignalled = 128;  // + the signal number
}  // namespace exit_status

// ---- The heartbeat -----------------------------------------------------------------------
// How a worker tells its agent "I am making progress" (any language can do it):
//   - The agent names one file per rank in TOPOLAUNCH_HEARTBEAT_FILE; the file does not exist
//     until the worker first writes it (opened for writing with create, as below).
//   - The worker overwrites the file with its progress counter (e.g. the step number) as decimal
//     text and a newline, at least once per [job] heartbeat_timeout; a beat is any change of the
//     file's mtime or content. Shell: `echo $step > "$TOPOLAUNCH_HEARTBEAT_FILE"`; Python:
//     `open(os.environ["TOPOLAUNCH_HEARTBEAT_FILE"], "w").write(str(step))`.
//   - With heartbeat_timeout set, a rank whose file has not changed for the timeout is declared
//     hung, and the job is stopped and restarted like after a crash. The watch of a rank is armed
//     by its first beat, so a program that was never told to beat is never declared hung by it;
//     topolaunch-worker, which beats before its first step, is watched from its start (a hang in
//     its wireup counts). The last counter is named in the report, so a hung rank (counter
//     stuck) is told apart from a slow one (counter moving, slowly); of the ranks of a
//     collective hang, the one named is the one that stopped first (a stopped process, else the
//     lowest counter, else the first to fall silent), not the ranks waiting for it.
//   - Without TOPOLAUNCH_HEARTBEAT_FILE (not started by topolaunch) beating does nothing.
class HeartbeatWriter {
 public:
  HeartbeatWriter();  // the file TOPOLAUNCH_HEARTBEAT_FILE names, if any
  explicit HeartbeatWriter(const std::string& path);
  ~HeartbeatWriter();
  HeartbeatWriter(const HeartbeatWriter&) = delete;
  HeartbeatWriter& operator=(const HeartbeatWriter&) = delete;

  bool active() const { return fd_ >= 0; }

  // Records progress: one pwrite, no allocation (async-signal-safe); call it once per step. A
  // write that fails is not reported: a missed beat is the agent's to judge.
  void beat(std::uint64_t counter);

 private:
  int fd_ = -1;
};

}  // namespace topolaunch::jobspec
