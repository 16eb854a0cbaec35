import { saveUnsaved } from '../save';

/** A document as the save reads it; `writes` counts its saves. */
function doc(
  path: string,
  dirty: boolean,
  over: { readOnly?: boolean; writable?: boolean; fail?: boolean } = {}
) {
  const model = { dirty, readOnly: over.readOnly ?? false };
  const d = {
    path,
    model,
    contentsModel: { writable: over.writable ?? true },
    writes: 0,
    save: async (): Promise<void> => {
      d.writes += 1;
      if (over.fail) {
        throw new Error('No space left on device');
      }
      model.dirty = false;
    }
  };
  return d;
}

describe('saving the open documents before a preemption', () => {
  it('saves each dirty document once and writes no clean one', async () => {
    const edited = doc('proj/train.ipynb', true);
    const clean = doc('proj/notes.ipynb', false);
    const script = doc('proj/prep.py', true);
    // train.ipynb open twice (a notebook and its editor view): one save.
    const result = await saveUnsaved([edited, clean, undefined, script, edited]);
    expect(result).toEqual({ saved: ['proj/train.ipynb', 'proj/prep.py'], failed: [] });
    expect([edited.writes, clean.writes, script.writes]).toEqual([1, 0, 1]);
  });

  it('leaves read-only documents alone', async () => {
    const readOnly = doc('shared/data.ipynb', true, { readOnly: true });
    const notWritable = doc('shared/ro.ipynb', true, { writable: false });
    expect(await saveUnsaved([readOnly, notWritable])).toEqual({ saved: [], failed: [] });
    expect(readOnly.writes + notWritable.writes).toBe(0);
  });

  it('saves the others when one save fails, and says which failed', async () => {
    const full = doc('proj/big.ipynb', true, { fail: true });
    const fine = doc('proj/train.ipynb', true);
    const result = await saveUnsaved([full, fine]);
    expect(result.saved).toEqual(['proj/train.ipynb']);
    expect(result.failed).toEqual([{ path: 'proj/big.ipynb', error: 'No space left on device' }]);
  });

  it('writes nothing a second time once saved (a repeated warning saves no clean file)', async () => {
    const edited = doc('proj/train.ipynb', true);
    await saveUnsaved([edited]);
    expect(await saveUnsaved([edited])).toEqual({ saved: [], failed: [] });
    expect(edited.writes).toBe(1);
  });
});
