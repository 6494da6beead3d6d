#include "catch.hpp"
#include "topolaunch/rdma/blob.hpp"

using namespace topolaunch::rdma;

TEST_CASE("a blob round-trips binary payloads, NUL bytes included") {
  const std::string payload("\0\x01\xff worker address \0", 20);
  const std::string blob = encode_blob(BlobKind::ucx_worker_address, 5, payload);
  auto back = decode_blob(blob, BlobKind::ucx_worker_address, 5, "hostcomm/addr/5");
  REQUIRE(back.ok());
  CHECK(*back == payload);
  auto empty = decode_blob(encode_blob(BlobKind::memory_key, 0, ""), BlobKind::memory_key, 0, "k");
  REQUIRE(empty.ok());
  CHECK(empty->empty());
}

TEST_CASE("every single flipped bit of a blob is an error naming the peer and the key") {
  const std::string blob = encode_blob(BlobKind::verbs_qp, 3, "qp info payload");
  for (std::size_t byte = 0; byte < blob.size(); ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string bad = blob;
      bad[byte] = static_cast<char>(bad[byte] ^ (1 << bit));
      auto r = decode_blob(bad, BlobKind::verbs_qp, 3, "pf/qp/3/0");
      REQUIRE_FALSE(r.ok());
      CHECK(r.error().exit_code == 2);
      CHECK(r.error().message.find("corrupted blob from rank 3") != std::string::npos);
      CHECK(r.error().message.find("\"pf/qp/3/0\"") != std::string::npos);
    }
  }
}

TEST_CASE("truncated, wrong-kind and wrong-rank blobs are refused with the reason") {
  const std::string blob = encode_blob(BlobKind::verbs_qp, 3, "0123456789");
  auto truncated = decode_blob(blob.substr(0, blob.size() - 1), BlobKind::verbs_qp, 3, "k");
  REQUIRE_FALSE(truncated.ok());
  CHECK(truncated.error().message.find("length") != std::string::npos);
  auto kind = decode_blob(blob, BlobKind::ucx_worker_address, 3, "k");
  REQUIRE_FALSE(kind.ok());
  CHECK(kind.error().message.find("kind 2") != std::string::npos);
  auto rank = decode_blob(blob, BlobKind::verbs_qp, 4, "k");
  REQUIRE_FALSE(rank.ok());
  CHECK(rank.error().message.find("published by rank 3") != std::string::npos);
  CHECK_FALSE(decode_blob("", BlobKind::verbs_qp, 1, "k").ok());
}

TEST_CASE("crc32 is the IEEE polynomial (check value of \"123456789\")") {
  CHECK(crc32("123456789") == 0xcbf43926u);
}
