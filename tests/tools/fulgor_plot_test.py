"""fulgor-plot on CSV files as CSVLogger writes them, and on bad ones.

    python3 fulgor_plot_test.py PATH/TO/fulgor-plot
"""

import os
import subprocess
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET

PLOT = sys.argv.pop(1) if len(sys.argv) > 1 else "fulgor-plot"
SVG = "{http://www.w3.org/2000/svg}"

# Two epochs of four steps, validated after each, with a learning rate.
METRICS = """step,epoch,lr-Adam,train_loss,val_acc,val_loss
0,0,0.1,0.9,,
1,0,0.1,0.8,,
1,0,,,0.5,0.85
2,1,0.05,0.6,,
3,1,0.05,0.5,,
3,1,,,0.75,0.55
"""


def run(*args):
    # A timeout, so that a read or write that waits fails rather than hangs.
    return subprocess.run([PLOT, *args], capture_output=True, text=True, timeout=60)


class Plot(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def write(self, name, text):
        path = os.path.join(self.dir.name, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def plot(self, text):
        csv = self.write("metrics.csv", text)
        svg = os.path.join(self.dir.name, "curves.svg")
        result = run(csv, "-o", svg)
        self.assertEqual(result.returncode, 0, result.stderr)
        return ET.parse(svg).getroot()  # raises on XML that is not well-formed

    def test_one_panel_per_metric_with_the_stages_overlaid(self):
        root = self.plot(METRICS)
        self.assertEqual(root.tag, SVG + "svg")
        panels = {g.get("data-panel"): g for g in root.iter(SVG + "g") if g.get("class") == "panel"}
        self.assertEqual(list(panels), ["lr-Adam", "loss", "acc"])
        lines = {name: {p.get("data-metric"): p for p in g.iter(SVG + "polyline")} for name, g in panels.items()}
        self.assertEqual(set(lines["loss"]), {"train_loss", "val_loss"})
        self.assertEqual(set(lines["acc"]), {"val_acc"})
        self.assertEqual(set(lines["lr-Adam"]), {"lr-Adam"})

        def points(line):
            return [tuple(map(float, p.split(","))) for p in line.get("points").split()]

        # A point per row that has the metric, inside the axes, in step order.
        axes = panels["loss"].find(SVG + "rect")
        x0, y0 = float(axes.get("x")), float(axes.get("y"))
        x1, y1 = x0 + float(axes.get("width")), y0 + float(axes.get("height"))
        train = points(lines["loss"]["train_loss"])
        self.assertEqual(len(train), 4)
        self.assertEqual(len(points(lines["loss"]["val_loss"])), 2)
        for x, y in train + points(lines["loss"]["val_loss"]):
            self.assertTrue(x0 - 1e-6 <= x <= x1 + 1e-6 and y0 - 1e-6 <= y <= y1 + 1e-6, (x, y))
        self.assertEqual([x for x, _ in train], sorted(x for x, _ in train))
        self.assertGreater(train[-1][1], train[0][1], "0.5 is drawn below 0.9 (SVG's y grows downwards)")

        # Axes with labelled ticks, and a legend naming each curve.
        loss = panels["loss"]
        groups = {g.get("class"): g for g in loss.iter(SVG + "g")}
        for axis in ("x-ticks", "y-ticks"):
            labels = [t.text for t in groups[axis].iter(SVG + "text")]
            self.assertGreaterEqual(len(labels), 3, axis)
            for text in labels:
                float(text)
        self.assertIn("0", [t.text for t in groups["x-ticks"].iter(SVG + "text")])
        self.assertEqual(sorted(t.text for t in groups["legend"].iter(SVG + "text")), ["train_loss", "val_loss"])
        self.assertEqual([t.text for t in loss.iter(SVG + "text") if t.get("class") == "x-label"], ["step"])

    def test_the_svg_goes_beside_the_csv_by_default(self):
        csv = self.write("metrics.csv", METRICS)
        result = run(csv)
        self.assertEqual(result.returncode, 0, result.stderr)
        svg = os.path.join(self.dir.name, "metrics.svg")
        self.assertEqual(result.stdout.strip(), svg)
        ET.parse(svg)

    def test_a_single_value_is_drawn(self):
        root = self.plot("step,test_acc\n5,0.875\n")
        self.assertEqual(len(list(root.iter(SVG + "polyline"))), 1)
        self.assertEqual(len(list(root.iter(SVG + "circle"))), 1)

    def test_names_are_escaped(self):
        root = self.plot("step,a<b&c\n0,1\n1,2\n")
        self.assertEqual([p.get("data-metric") for p in root.iter(SVG + "polyline")], ["a<b&c"])

    def assert_fails(self, args, status, *words):
        result = run(*args)
        self.assertEqual(result.returncode, status, result.stdout + result.stderr)
        for word in words:
            self.assertIn(word, result.stderr)

    def test_a_missing_file_is_an_error(self):
        missing = os.path.join(self.dir.name, "nothing.csv")
        self.assert_fails([missing], 1, "cannot be opened", missing)
        self.assertFalse(os.path.exists(os.path.join(self.dir.name, "nothing.svg")))

    def test_a_fifo_is_refused_without_waiting(self):
        fifo = os.path.join(self.dir.name, "metrics.csv")
        os.mkfifo(fifo)
        self.assert_fails([fifo], 1, fifo, "is a FIFO, not a regular file")
        csv = self.write("m.csv", "step,loss\n0,1\n1,2\n")
        svg = os.path.join(self.dir.name, "out.svg")
        os.mkfifo(svg)
        self.assert_fails([csv, "-o", svg], 1, svg, "is a FIFO, not a regular file")

    def test_a_csv_without_step_is_an_error(self):
        self.assert_fails([self.write("m.csv", "epoch,loss\n0,1.5\n")], 1, "no 'step' column", "epoch,loss")

    def test_a_csv_without_numbers_is_an_error(self):
        self.assert_fails([self.write("empty.csv", "")], 1, "empty")
        self.assert_fails([self.write("header.csv", "step,epoch,loss\n")], 1, "no numeric values")
        self.assert_fails([self.write("text.csv", "step,loss\n0,abc\n1,\n")], 1, "no numeric values")
        self.assert_fails([self.write("steps.csv", "step,loss\nzero,1\n")], 1, "line 2", "no step number")

    def test_a_bad_command_line_is_an_error(self):
        self.assert_fails([], 2, "no CSV file given", "usage")
        self.assert_fails(["a.csv", "--colour"], 2, "unknown option '--colour'")
        self.assert_fails(["a.csv", "-o"], 2, "-o needs a file name")


if __name__ == "__main__":
    unittest.main(verbosity=2)
