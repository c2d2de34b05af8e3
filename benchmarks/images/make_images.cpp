// Synthesises the image benchmark's data set: JPEGs of 500 x 375 at quality
// 90 with photo-like content (smooth shading, soft-edged shapes, a little
// grain; not noise, which decodes far slower), in 100 class folders.
//
// usage: fulgor-make-images OUTPUT_DIR COUNT

#include <turbojpeg.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: fulgor-make-images OUTPUT_DIR COUNT\n");
    return 2;
  }
  const std::string out = argv[1];
  const int count = std::stoi(argv[2]), w = 500, h = 375;
  tjhandle handle = tjInitCompress();
  std::vector<unsigned char> pixels(static_cast<size_t>(w * h * 3));
  size_t bytes = 0;
  for (int i = 0; i < count; ++i) {
    std::mt19937 rng(static_cast<unsigned>(i));
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    float base[3], slope[3][2];
    for (int c = 0; c < 3; ++c) {
      base[c] = 40 + 170 * u(rng);
      slope[c][0] = (u(rng) - 0.5f) * 0.4f;
      slope[c][1] = (u(rng) - 0.5f) * 0.4f;
    }
    struct Blob {
      float x, y, r, color[3];
    };
    std::vector<Blob> blobs(6);
    for (auto& b : blobs) b = {u(rng) * w, u(rng) * h, 20 + 80 * u(rng), {255 * u(rng), 255 * u(rng), 255 * u(rng)}};
    std::normal_distribution<float> grain(0.0f, 3.0f);
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x)
        for (int c = 0; c < 3; ++c) {
          float v = base[c] + slope[c][0] * x + slope[c][1] * y;
          for (const auto& b : blobs) {
            const float d = std::hypot(x - b.x, y - b.y) / b.r;
            const float a = 1.0f / (1.0f + std::exp((d - 1.0f) * 8.0f));  // a soft edge
            v = v * (1 - a) + b.color[c] * a;
          }
          v += grain(rng);
          pixels[static_cast<size_t>((y * w + x) * 3 + c)] =
              static_cast<unsigned char>(std::fmin(255.0f, std::fmax(0.0f, v)));
        }
    unsigned char* jpeg = nullptr;
    unsigned long size = 0;
    if (tjCompress2(handle, pixels.data(), w, 0, h, TJPF_RGB, &jpeg, &size, TJSAMP_420, 90, 0) != 0) return 1;
    const std::string dir = out + "/class" + std::to_string(i % 100);
    std::filesystem::create_directories(dir);
    std::ofstream(dir + "/" + std::to_string(i) + ".jpg", std::ios::binary)
        .write(reinterpret_cast<const char*>(jpeg), static_cast<std::streamsize>(size));
    bytes += size;
    tjFree(jpeg);
  }
  tjDestroy(handle);
  std::printf("%d JPEGs of %dx%d, %.1f KB on average, in %s\n", count, w, h, bytes / 1024.0 / count, out.c_str());
  return 0;
}
