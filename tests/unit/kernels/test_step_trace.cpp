// A rank's step timeline as Chrome trace-event JSON: one process, a named thread per track, the
// spans with their op, bucket and bytes, names escaped, the clock-sync points and the overhead.
#include <string>

#include "catch.hpp"
#include "topolaunch/kernels/step_trace.hpp"

using namespace topolaunch::kernels;

TEST_CASE("step trace: which steps are traced, and the trace-event JSON of their spans") {
  StepTrace t({9, 3});
  CHECK(t.traces(3));
  CHECK(t.traces(9));
  CHECK_FALSE(t.traces(4));
  CHECK(t.last_step() == 9);
  t.add(TraceSpan{"h0.\"attn\"", "forward", TraceTrack::compute, 1000.5, 20.25, 3, 12, -1, 0});
  t.add(TraceSpan{"bucket 0", "all-reduce", TraceTrack::communication, 1030, 5, 3, 40, 0, 4096});
  t.add_clock_sync({3, 0, 1100});
  TraceMetadata meta;
  meta.rank = 1;
  meta.world_size = 2;
  meta.node = "n1";
  meta.backend = "cpu";
  meta.plan_ops = 41;
  meta.steps = {3};
  meta.traced_step_ms = {12.5};
  meta.untraced_reference_ms = {12.0};
  const std::string json = t.to_json(meta);
  CHECK(json.rfind("{\"traceEvents\":[\n", 0) == 0);
  CHECK(json.find("{\"ph\":\"M\",\"pid\":1,\"tid\":0,\"name\":\"process_name\",\"args\":{\"name\":"
                  "\"rank 1 (n1)\"}}") != std::string::npos);
  CHECK(json.find("\"tid\":2,\"name\":\"thread_name\",\"args\":{\"name\":\"communication stream") !=
        std::string::npos);
  CHECK(json.find("{\"ph\":\"X\",\"pid\":1,\"tid\":1,\"ts\":1000.500,\"dur\":20.250,\"name\":"
                  "\"h0.\\\"attn\\\"\",\"cat\":\"forward\",\"args\":{\"step\":3,\"op\":12}}") !=
        std::string::npos);
  CHECK(json.find("\"args\":{\"step\":3,\"op\":40,\"bucket\":0,\"bytes\":4096}") !=
        std::string::npos);
  CHECK(json.find("\"sync_points\":[{\"step\":3,\"index\":0,\"t_us\":1100.000}]") !=
        std::string::npos);
  CHECK(json.find("\"traced_step_ms\":[12.500],\"untraced_reference_ms\":[12.000]") !=
        std::string::npos);
  CHECK(json.find("\"plan_ops\":41") != std::string::npos);
}
