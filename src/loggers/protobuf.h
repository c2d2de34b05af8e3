#pragma once

// A protocol buffers encoder for the few messages the TensorBoard logger
// writes, so that fulgor needs no protobuf library.

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace fulgor::detail::proto {

/// One message, built field by field in the wire format
/// (https://protobuf.dev/programming-guides/encoding/). Fields are written in
/// the order they are added; proto3 readers accept any order.
class Message {
 public:
  Message& varint_field(uint32_t field, uint64_t value) {
    key(field, 0);
    put_varint(value);
    return *this;
  }
  Message& double_field(uint32_t field, double value) {
    uint64_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    key(field, 1);
    put_little_endian(bits, 8);
    return *this;
  }
  Message& float_field(uint32_t field, float value) {
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    key(field, 5);
    put_little_endian(bits, 4);
    return *this;
  }
  /// Strings, bytes and embedded messages.
  Message& bytes_field(uint32_t field, std::string_view value) {
    key(field, 2);
    put_varint(value.size());
    data_.append(value);
    return *this;
  }
  Message& message_field(uint32_t field, const Message& value) { return bytes_field(field, value.data_); }

  const std::string& data() const { return data_; }

 private:
  void key(uint32_t field, uint32_t wire_type) { put_varint((uint64_t{field} << 3) | wire_type); }
  void put_varint(uint64_t value) {
    while (value >= 0x80) {
      data_.push_back(static_cast<char>((value & 0x7F) | 0x80));
      value >>= 7;
    }
    data_.push_back(static_cast<char>(value));
  }
  void put_little_endian(uint64_t value, int bytes) {
    for (int i = 0; i < bytes; ++i) data_.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
  }

  std::string data_;
};

}  // namespace fulgor::detail::proto
