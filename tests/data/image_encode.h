#pragma once

// Small images encoded in the tests, with libjpeg-turbo's and libpng's
// encoders: the data the image tests decode.

#include <png.h>
#include <turbojpeg.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace fulgor::testing {

// A smooth picture (gradients, as photos are), HWC, varying with `seed`.
inline std::vector<uint8_t> test_picture(int width, int height, int channels, int seed = 0) {
  std::vector<uint8_t> pixels(static_cast<size_t>(width * height * channels));
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x)
      for (int c = 0; c < channels; ++c)
        pixels[static_cast<size_t>((y * width + x) * channels + c)] =
            static_cast<uint8_t>((x * 255 / width + y * 97 / height * (c + 1) + seed * 37 + c * 50) % 256);
  return pixels;
}

inline std::vector<uint8_t> encode_jpeg(const std::vector<uint8_t>& pixels, int width, int height, int channels,
                                        int quality = 95, int subsampling = TJSAMP_420) {
  tjhandle handle = tjInitCompress();
  unsigned char* out = nullptr;
  unsigned long size = 0;
  const int status = tjCompress2(handle, pixels.data(), width, 0, height, channels == 1 ? TJPF_GRAY : TJPF_RGB, &out,
                                 &size, channels == 1 ? TJSAMP_GRAY : subsampling, quality, 0);
  std::vector<uint8_t> bytes(out, out + size);
  tjFree(out);
  tjDestroy(handle);
  if (status != 0) throw std::runtime_error("tjCompress2 failed");
  return bytes;
}

inline std::vector<uint8_t> encode_png(const std::vector<uint8_t>& pixels, int width, int height, int channels) {
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  image.width = static_cast<png_uint_32>(width);
  image.height = static_cast<png_uint_32>(height);
  image.format = channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  if (!png_image_write_get_memory_size(image, size, 0, pixels.data(), 0, nullptr))
    throw std::runtime_error("png_image_write_get_memory_size failed");
  std::vector<uint8_t> bytes(size);
  if (!png_image_write_to_memory(&image, bytes.data(), &size, 0, pixels.data(), 0, nullptr))
    throw std::runtime_error("png_image_write_to_memory failed");
  bytes.resize(size);
  return bytes;
}

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace fulgor::testing
