/**
 * The sidebar's "Advice" section in words: what `GET api/advice` says about my own GPU
 * use (the gateway gives a user only their own `smaller_gpu` advice), with its evidence,
 * or why there is none. Plain TypeScript, tested with Jest.
 */

import type { AdviceAnswer } from './types';

/** How long the sidebar keeps an answer before asking again (the gateway caches too). */
export const ADVICE_MAX_AGE_MS = 10 * 60 * 1000;

export interface AdviceView {
  /** One line per piece of advice: the sentence, and its evidence in a few words. */
  items: Array<{ sentence: string; evidence: string }>;
  /** Shown when there is nothing to advise, or that the answer is an older one. */
  note: string;
}

function days(seconds: number): string {
  const d = Math.round(seconds / 86400);
  return d === 1 ? 'day' : `${d} days`;
}

function evidenceWords(evidence: Record<string, unknown>): string {
  const grants = evidence.grants;
  const low = evidence.grants_at_or_under;
  if (typeof grants === 'number' && typeof low === 'number') {
    return `${low} of ${grants} grants peaked low`;
  }
  return typeof grants === 'number' ? `from ${grants} grants` : '';
}

export function adviceView(answer: AdviceAnswer, now: number = Date.now() / 1000): AdviceView {
  const items = answer.advice.map(a => ({
    sentence: a.sentence,
    evidence: evidenceWords(a.evidence)
  }));
  const period = days(answer.until - answer.since);
  let note = '';
  if (!items.length) {
    note =
      `No advice about your GPU use in the last ${period}: nothing stands out on at ` +
      `least ${answer.min_grants} grants.`;
  }
  if (answer.stale) {
    const age = Math.max(1, Math.round((now - answer.until) / 60));
    const stale = `Worked out ${age} min ago; a fresher answer is on its way.`;
    note = note ? `${note} ${stale}` : stale;
  }
  return { items, note };
}
