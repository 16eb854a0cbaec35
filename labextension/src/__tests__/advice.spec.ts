/** The sidebar's advice in words (issue 43 item 4: "in the sidebar for a user's own work"). */
import { adviceView } from '../advice';
import { GpuModel } from '../model';
import type { AdviceAnswer } from '../types';

const DAY = 86400;

function answer(over: Partial<AdviceAnswer> = {}): AdviceAnswer {
  return {
    advice: [],
    since: 1_000_000,
    until: 1_000_000 + 30 * DAY,
    requests: 12,
    min_grants: 10,
    ...over
  };
}

const SMALLER = {
  kind: 'smaller_gpu' as const,
  subject: 'alice',
  tenant: 'vision',
  flavor: 'a100',
  sentence: "alice's kernels on a100 peaked at 15% GPU utilization or less in 12 of 12 grants",
  evidence: { grants: 12, grants_at_or_under: 12, p90_peak_utilization: 0.15 }
};

describe('adviceView', () => {
  it('shows each sentence with its evidence and no note', () => {
    const view = adviceView(answer({ advice: [SMALLER] }));
    expect(view.items).toEqual([{ sentence: SMALLER.sentence, evidence: '12 of 12 grants peaked low' }]);
    expect(view.note).toBe('');
  });

  it('says why there is none, with the period and the minimum', () => {
    const view = adviceView(answer({ min_grants: 5 }));
    expect(view.items).toEqual([]);
    expect(view.note).toBe(
      'No advice about your GPU use in the last 30 days: nothing stands out on at least 5 grants.'
    );
  });

  it('says that a stale answer is an older one', () => {
    const stale = answer({ advice: [SMALLER], stale: true });
    const view = adviceView(stale, stale.until + 7 * 60);
    expect(view.items).toHaveLength(1);
    expect(view.note).toBe('Worked out 7 min ago; a fresher answer is on its way.');
    const none = adviceView(answer({ stale: true, until: 2_000_000, since: 2_000_000 - DAY }), 2_000_060);
    expect(none.note).toBe(
      'No advice about your GPU use in the last day: nothing stands out on at least 10 grants. ' +
        'Worked out 1 min ago; a fresher answer is on its way.'
    );
  });
});

describe('GpuModel.setAdvice', () => {
  it('keeps the last answer when a read fails, and says why', () => {
    const m = new GpuModel();
    expect(m.setAdvice(answer({ advice: [SMALLER] }))).toEqual([{ section: 'advice', keys: [] }]);
    const why = "the advice for the last 30 d is still being worked out from the store's history; ask again in 1 s";
    m.setAdvice(null, why);
    expect(m.advice?.advice).toEqual([SMALLER]);
    expect(m.adviceError).toBe(why);
    m.setAdvice(answer());
    expect(m.advice?.advice).toEqual([]);
    expect(m.adviceError).toBe('');
  });
});
