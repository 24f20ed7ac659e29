#include "memfit/core/render/json_writer.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

namespace memfit {
namespace {

TEST(JsonWriterTest, CompactNestedDocument) {
  JsonWriter w;
  w.begin_object();
  w.member("model", "resnet18");
  w.member("batch", 64);
  w.key("peaks").begin_array().value(int64_t{1} << 40).value(0).end_array();
  w.key("fits").value(true);
  w.key("none").null();
  w.key("empty").begin_object().end_object();
  w.key("list").begin_array().end_array();
  w.end_object();
  EXPECT_EQ(w.str(),
            "{\"model\":\"resnet18\",\"batch\":64,\"peaks\":[1099511627776,0],"
            "\"fits\":true,\"none\":null,\"empty\":{},\"list\":[]}");
}

TEST(JsonWriterTest, PrettyPrintsWithTwoSpaceIndent) {
  JsonWriter w(/*pretty=*/true);
  w.begin_object();
  w.member("a", 1);
  w.key("b").begin_array().value(1).begin_object().member("c", false);
  w.end_object().end_array();
  w.key("d").begin_object().end_object();
  w.end_object();
  EXPECT_EQ(w.str(),
            "{\n"
            "  \"a\": 1,\n"
            "  \"b\": [\n"
            "    1,\n"
            "    {\n"
            "      \"c\": false\n"
            "    }\n"
            "  ],\n"
            "  \"d\": {}\n"
            "}");
}

TEST(JsonWriterTest, EscapesQuotesBackslashesAndControlCharacters) {
  JsonWriter w;
  w.value("say \"hi\"\\ \n\t\x01\x1f end \xc2\xb5s");
  EXPECT_EQ(
      w.str(),
      "\"say \\\"hi\\\"\\\\ \\u000a\\u0009\\u0001\\u001f end \xc2\xb5s\"");
  EXPECT_EQ(json_quote(std::string("a\0b", 3)), "\"a\\u0000b\"");
}

TEST(JsonWriterTest, KeysAreEscapedToo) {
  JsonWriter w;
  w.begin_object().member("model.\"fc\"", 1).end_object();
  EXPECT_EQ(w.str(), "{\"model.\\\"fc\\\"\":1}");
}

TEST(JsonWriterTest, NumbersOfEveryKind) {
  JsonWriter w;
  w.begin_array();
  w.value(std::numeric_limits<int64_t>::min());
  w.value(std::numeric_limits<uint64_t>::max());
  w.value(size_t{7});
  w.value(0.1);
  w.value(2.0);
  w.value(-1.5e-7);
  w.value(1e300);
  w.value(std::numeric_limits<double>::infinity());
  w.value(std::numeric_limits<double>::quiet_NaN());
  w.end_array();
  EXPECT_EQ(w.str(),
            "[-9223372036854775808,18446744073709551615,7,0.1,2.0,-1.5e-07,"
            "1e+300,null,null]");
}

TEST(JsonWriterTest, DoublesRoundTrip) {
  JsonWriter w;
  w.value(0.1 + 0.2);
  EXPECT_EQ(w.str(), "0.30000000000000004");
}

TEST(JsonWriterTest, ScalarRootDocument) {
  JsonWriter w;
  w.value("alone");
  EXPECT_EQ(w.str(), "\"alone\"");
  EXPECT_THROW(w.value(1), std::runtime_error);  // one root only
}

TEST(JsonWriterTest, ValueWhereAKeyIsNeededThrows) {
  JsonWriter w;
  w.begin_object();
  try {
    w.value(1);
    FAIL() << "expected std::runtime_error";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()),
              "[JsonWriter::value] a value inside an object needs a key: "
              "call key() first");
  }
  EXPECT_THROW(w.begin_array(), std::runtime_error);
  // The writer is unchanged by the failed calls.
  w.member("ok", 1).end_object();
  EXPECT_EQ(w.str(), "{\"ok\":1}");
}

TEST(JsonWriterTest, KeyMisuseThrows) {
  JsonWriter a;
  a.begin_array();
  EXPECT_THROW(a.key("x"), std::runtime_error);  // keys only in objects
  JsonWriter b;
  b.begin_object().key("x");
  EXPECT_THROW(b.key("y"), std::runtime_error);      // key after key
  EXPECT_THROW(b.end_object(), std::runtime_error);  // key without value
  JsonWriter c;
  EXPECT_THROW(c.key("x"), std::runtime_error);
}

TEST(JsonWriterTest, UnbalancedEndsThrow) {
  JsonWriter a;
  EXPECT_THROW(a.end_object(), std::runtime_error);
  EXPECT_THROW(a.end_array(), std::runtime_error);
  JsonWriter b;
  b.begin_object();
  try {
    b.end_array();
    FAIL() << "expected std::runtime_error";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()),
              "[JsonWriter::end_array] the innermost open container is an "
              "object: call end_object() first");
  }
  JsonWriter c;
  c.begin_array();
  EXPECT_THROW(c.end_object(), std::runtime_error);
  c.end_array();
  EXPECT_THROW(c.end_array(), std::runtime_error);
}

TEST(JsonWriterTest, IncompleteDocumentHasNoString) {
  JsonWriter w;
  EXPECT_THROW(w.str(), std::runtime_error);
  w.begin_object();
  EXPECT_THROW(w.str(), std::runtime_error);
}

}  // namespace
}  // namespace memfit
