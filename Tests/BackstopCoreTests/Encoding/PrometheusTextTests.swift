import BackstopCore
import Testing

/// `PrometheusText`, the one writer of the `/metrics` exposition.
@Suite("Prometheus text")
struct PrometheusTextTests {
    @Test("a family's HELP and TYPE lines, samples with and without labels, label values escaped, in order")
    func exposition() {
        var out = PrometheusText()
        out.family("backstop_x_total", .counter, "Things, by kind.")
        out.sample("backstop_x_total", ["upstream": "a\"b\\c\nd", "kind": "one"], 3)
        out.sample("backstop_x_total", 0.5)
        var other = PrometheusText()
        other.family("backstop_y", .summary, "Y.")
        out.append(other)
        #expect(
            out.text
                == "# HELP backstop_x_total Things, by kind.\n# TYPE backstop_x_total counter\n"
                + "backstop_x_total{upstream=\"a\\\"b\\\\c\\nd\",kind=\"one\"} 3\n"
                + "backstop_x_total 0.5\n# HELP backstop_y Y.\n# TYPE backstop_y summary\n")
    }
}
