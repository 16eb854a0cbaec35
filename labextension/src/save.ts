/**
 * Saving the open documents before a preemption stops their server or kernel (issue 42
 * item 4): every open document with unsaved changes is saved once; one that is not dirty
 * is not written again (its file, perhaps changed on disk by a job or a git pull since it
 * was opened, stays as it is, and no "file changed" dialog interrupts the warning), and a
 * read-only one is left alone. JupyterLab's `docmanager:save-all` writes every writable
 * open document, dirty or not, so it is not used.
 *
 * Plain TypeScript over the little of a JupyterLab document context it reads, so Jest
 * tests it without JupyterLab.
 */

/** What of a JupyterLab `DocumentRegistry.Context` the save reads. */
export interface SavableDocument {
  readonly path: string;
  readonly model: { readonly dirty: boolean; readonly readOnly?: boolean };
  readonly contentsModel: { readonly writable?: boolean } | null;
  save(): Promise<void>;
}

/** What came of a save of the unsaved documents: the paths saved, and those that failed. */
export interface SaveResult {
  saved: string[];
  failed: { path: string; error: string }[];
}

/**
 * Save each document of `documents` (one per open widget; a path open twice is saved
 * once) that has unsaved changes and may be written. Every save starts at once; one
 * that fails does not stop the others.
 */
export async function saveUnsaved(
  documents: Iterable<SavableDocument | undefined>
): Promise<SaveResult> {
  const seen = new Set<string>();
  const started: { path: string; done: Promise<void> }[] = [];
  for (const doc of documents) {
    if (!doc || seen.has(doc.path)) {
      continue;
    }
    seen.add(doc.path);
    if (!doc.model.dirty || doc.model.readOnly || doc.contentsModel?.writable === false) {
      continue;
    }
    started.push({ path: doc.path, done: doc.save() });
  }
  const outcomes = await Promise.allSettled(started.map(s => s.done));
  const result: SaveResult = { saved: [], failed: [] };
  outcomes.forEach((o, i) => {
    if (o.status === 'fulfilled') {
      result.saved.push(started[i].path);
    } else {
      const reason = o.reason as { message?: string } | undefined;
      result.failed.push({ path: started[i].path, error: reason?.message ?? String(o.reason) });
    }
  });
  return result;
}
