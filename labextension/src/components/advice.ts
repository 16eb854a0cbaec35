/** "Advice": what the gateway's history says about my own GPU use (`GET api/advice`),
 * each sentence with its evidence; or why there is none, or why it cannot be read. */

import { adviceView } from '../advice';
import { GpuModel } from '../model';
import { h, section } from './dom';

export class AdviceSection {
  readonly root: HTMLElement;
  private list: HTMLElement;
  private note: HTMLElement;

  constructor(private readonly model: GpuModel) {
    const s = section('advice', 'Advice');
    this.root = s.root;
    this.list = h('ul', { class: 'jp-gpuaas-list', 'aria-label': 'Advice about my GPU use' });
    this.note = h('p', { class: 'jp-gpuaas-empty', text: 'Reading advice…' });
    s.body.append(this.list, this.note);
  }

  update(): void {
    const answer = this.model.advice;
    const view = answer ? adviceView(answer) : { items: [], note: '' };
    this.list.replaceChildren(
      ...view.items.map(item =>
        h('li', { class: 'jp-gpuaas-row jp-gpuaas-advice-row' },
          h('div', { class: 'jp-gpuaas-advice-sentence', text: item.sentence }),
          item.evidence ? h('div', { class: 'jp-gpuaas-detail', text: item.evidence }) : null
        )
      )
    );
    const note = [view.note, this.model.adviceError].filter(Boolean).join(' ');
    this.note.textContent = note || (answer ? '' : 'Reading advice…');
    this.note.hidden = !this.note.textContent;
  }
}
