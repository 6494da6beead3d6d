// A rank's step timeline as Chrome trace-event JSON; see step_trace.hpp.
#include "topolaunch/kernels/step_trace.hpp"

#include <algorithm>
#include <cstdio>
#include <ctime>

namespace topolaunch::kernels {

namespace {

void append_json_string(std::string& out, std::string_view text) {
  out += '"';
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", u);
      out += buf;
    } else {
      out += c;
    }
  }
  out += '"';
}

void append_number(std::string& out, double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  out += buf;
}

const char* track_name(TraceTrack t) {
  switch (t) {
    case TraceTrack::host:
      return "host: data input, checkpoints, waits";
    case TraceTrack::compute:
      return "compute stream: the plan's ops";
    case TraceTrack::communication:
      return "communication stream: gradient all-reduces";
  }
  return "?";
}

template <class T>
void append_list(std::string& out, const std::vector<T>& values) {
  out += '[';
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i) out += ',';
    if constexpr (std::is_integral_v<T>) {
      out += std::to_string(values[i]);
    } else {
      append_number(out, values[i]);
    }
  }
  out += ']';
}

}  // namespace

StepTrace::StepTrace(std::vector<std::int64_t> steps) : steps_(std::move(steps)) {
  std::sort(steps_.begin(), steps_.end());
}

bool StepTrace::traces(std::int64_t step) const {
  return std::binary_search(steps_.begin(), steps_.end(), step);
}

double StepTrace::now_us() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) / 1e3;
}

std::string StepTrace::to_json(const TraceMetadata& meta) const {
  std::string out;
  out.reserve(256 + spans_.size() * 160);
  const std::string pid = std::to_string(meta.rank);
  out += "{\"traceEvents\":[\n";
  out +=
      "{\"ph\":\"M\",\"pid\":" + pid + ",\"tid\":0,\"name\":\"process_name\",\"args\":{\"name\":";
  append_json_string(out, "rank " + pid + (meta.node.empty() ? "" : " (" + meta.node + ")"));
  out += "}},\n{\"ph\":\"M\",\"pid\":" + pid +
         ",\"tid\":0,\"name\":\"process_sort_index\",\"args\":{\"sort_index\":" + pid + "}}";
  for (TraceTrack t : {TraceTrack::host, TraceTrack::compute, TraceTrack::communication}) {
    const std::string tid = std::to_string(static_cast<int>(t));
    out += ",\n{\"ph\":\"M\",\"pid\":" + pid + ",\"tid\":" + tid +
           ",\"name\":\"thread_name\",\"args\":{\"name\":";
    append_json_string(out, track_name(t));
    out += "}},\n{\"ph\":\"M\",\"pid\":" + pid + ",\"tid\":" + tid +
           ",\"name\":\"thread_sort_index\",\"args\":{\"sort_index\":" + tid + "}}";
  }
  for (const TraceSpan& s : spans_) {
    out += ",\n{\"ph\":\"X\",\"pid\":" + pid +
           ",\"tid\":" + std::to_string(static_cast<int>(s.track)) + ",\"ts\":";
    append_number(out, s.start_us);
    out += ",\"dur\":";
    append_number(out, s.duration_us);
    out += ",\"name\":";
    append_json_string(out, s.name);
    out += ",\"cat\":";
    append_json_string(out, s.category);
    out += ",\"args\":{\"step\":" + std::to_string(s.step);
    if (s.op >= 0) out += ",\"op\":" + std::to_string(s.op);
    if (s.bucket >= 0) out += ",\"bucket\":" + std::to_string(s.bucket);
    if (s.bytes > 0) out += ",\"bytes\":" + std::to_string(s.bytes);
    out += "}}";
  }
  out += "\n],\n\"displayTimeUnit\":\"ms\",\n\"otherData\":{\"rank\":" + pid +
         ",\"world_size\":" + std::to_string(meta.world_size) + ",\"node\":";
  append_json_string(out, meta.node);
  out += ",\"backend\":";
  append_json_string(out, meta.backend);
  out += ",\"clock\":\"CLOCK_REALTIME, microseconds since the epoch\"";
  out += ",\"plan_ops\":" + std::to_string(meta.plan_ops) +
         ",\"plan_buckets\":" + std::to_string(meta.plan_buckets) + ",\"steps\":";
  append_list(out, meta.steps);
  out += ",\"sync_points\":[";
  for (std::size_t i = 0; i < sync_points_.size(); ++i) {
    const ClockSyncPoint& p = sync_points_[i];
    out += (i ? ",{\"step\":" : "{\"step\":") + std::to_string(p.step) +
           ",\"index\":" + std::to_string(p.index) + ",\"t_us\":";
    append_number(out, p.t_us);
    out += '}';
  }
  out += "],\"overhead\":{\"traced_step_ms\":";
  append_list(out, meta.traced_step_ms);
  out += ",\"untraced_reference_ms\":";
  append_list(out, meta.untraced_reference_ms);
  out += ",\"record_ns_per_span\":";
  append_number(out, meta.record_ns_per_span);
  out += ",\"render_ms\":";
  append_number(out, meta.render_ms);
  out += "}}}\n";
  return out;
}

}  // namespace topolaunch::kernels
