// Where the time goes: S_X per op type, the job's slowdown with only X's measured durations.
import type { Summary } from "../../api";
import { Section } from "../../components/ui";

export function Attribution({ s }: { s: Summary }) {
  const ops = Object.entries(s.attribution.by_op_type).sort((a, b) => b[1] - a[1]);
  if (!ops.length) return null;
  const max = Math.max(...ops.map(([, v]) => v), 1.0001);
  return (
    <Section title="Where the time goes (S_X by op type)">
      <table class="table bars">
        <tbody>
          {ops.map(([op, v]) => (
            <tr key={op}>
              <td>{op}</td>
              <td class="num">{v.toFixed(3)}×</td>
              <td class="bar-cell">
                <span class="bar" style={{ width: `${Math.max(1, ((v - 1) / (max - 1)) * 100)}%` }} />
              </td>
            </tr>
          ))}
        </tbody>
      </table>
      <p class="muted small">S_X: the job's slowdown with only op type X's measured durations restored (1.000× means it costs nothing).</p>
    </Section>
  );
}
