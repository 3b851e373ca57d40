// Why the job is slow (diagnoses with what to do) and who makes it slow (the stragglers).
import { hostPath, type Summary } from "../../api";
import { Link, Section, SlowdownBadge } from "../../components/ui";
import * as fmt from "../../format";

export function Diagnoses({ s, straggling }: { s: Summary; straggling: number | null }) {
  if (s.diagnoses.length === 0) {
    if (s.slowdown === null) return null;
    return (
      <Section title="Diagnoses">
        <p class="muted">No cause stands out: {straggling !== null && s.slowdown < straggling ? "the job is not straggling." : "see the attribution below."}</p>
      </Section>
    );
  }
  return (
    <Section title="Diagnoses">
      <div class="diagnoses" data-testid="diagnoses">
        {s.diagnoses.map((d) => (
          <div class={`diagnosis cause-${d.cause}`} key={d.cause} data-cause={d.cause}>
            <div class="diagnosis-head">
              <strong>{fmt.cause(d.cause)}</strong>
              <span>{fmt.percent(d.share, 0)} of the slowdown</span>
              <span class="muted">confidence {fmt.percent(d.confidence, 0)}</span>
            </div>
            <p>{d.recommendation}</p>
            <p class="muted small">{fmt.evidence(d.evidence, 6)}</p>
          </div>
        ))}
      </div>
    </Section>
  );
}

export function Stragglers({ s, workerHref }: { s: Summary; workerHref: (rank: number) => string }) {
  return (
    <Section title={`Stragglers (${s.stragglers.length})`}>
      {s.stragglers.length === 0 ? (
        <p class="muted">No worker stands out{s.slowdown !== null ? "" : " yet (not analysed)"}.</p>
      ) : (
        <table class="table" data-testid="stragglers">
          <thead>
            <tr>
              <th class="num">Rank</th>
              <th>Host</th>
              <th class="num">DP</th>
              <th class="num">Stage</th>
              <th class="num">S_w</th>
              <th>Cause</th>
              <th>Evidence</th>
            </tr>
          </thead>
          <tbody>
            {s.stragglers.map((x) => (
              <tr key={x.rank} data-rank={x.rank}>
                <td class="num">
                  <Link href={workerHref(x.rank)}>{x.rank}</Link>
                </td>
                <td>{x.host ? <Link href={hostPath(x.host)}>{x.host}</Link> : "–"}</td>
                <td class="num">{x.dp_rank}</td>
                <td class="num">{x.stage}</td>
                <td class="num">
                  <SlowdownBadge value={x.slowdown} />
                </td>
                <td>{fmt.cause(x.cause)}</td>
                <td class="muted small">{fmt.evidence(x.evidence)}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </Section>
  );
}
