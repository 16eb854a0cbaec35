/**
 * The sidebar's only way out: its own jupyter_server, same origin, with JupyterLab's
 * XSRF token (ServerConnection.makeRequest). The server forwards `gpuaas/api/*` to the
 * gateway with its own token, so no gateway token ever reaches the browser.
 */

import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { errorSentence } from './format';
import type { AdviceAnswer, Device, GpuKernelInfo, GpuRequest, Job, Me, Tenant } from './types';

/** A refused or failed call, with one sentence for people and the field it names. */
export class ApiError extends Error {
  constructor(
    message: string,
    readonly status: number,
    readonly field: string | null = null
  ) {
    super(message);
  }

  /** The gateway (or the server) cannot be reached: retry later, say so. */
  get unreachable(): boolean {
    return this.status === 0 || this.status === 502 || this.status === 503;
  }
}

export class GpuApi {
  readonly settings: ServerConnection.ISettings;

  constructor(settings?: ServerConnection.ISettings) {
    this.settings = settings ?? ServerConnection.makeSettings();
  }

  url(path: string): string {
    return URLExt.join(this.settings.baseUrl, path);
  }

  async call<T>(path: string, init: RequestInit = {}): Promise<T> {
    let response: Response;
    try {
      // `cache` set: 'no-store' would add a cache-busting query parameter the gateway refuses.
      response = await ServerConnection.makeRequest(
        this.url(path),
        { cache: 'no-cache', ...init },
        this.settings
      );
    } catch (e) {
      throw new ApiError('GPU service unreachable — retrying.', 0);
    }
    const text = await response.text();
    let body: unknown = null;
    if (text) {
      try {
        body = JSON.parse(text);
      } catch {
        body = text;
      }
    }
    if (!response.ok) {
      const field =
        body && typeof body === 'object' && 'field' in body
          ? ((body as { field: string | null }).field ?? null)
          : null;
      throw new ApiError(errorSentence(response.status, body), response.status, field);
    }
    return body as T;
  }

  me(): Promise<Me> {
    return this.call<Me>('gpuaas/api/me');
  }

  requests(user: string | null): Promise<GpuRequest[]> {
    const q = user ? `?user=${encodeURIComponent(user)}` : '';
    return this.call<GpuRequest[]>(`gpuaas/api/requests${q}`);
  }

  tenants(): Promise<{ simulated: boolean; tenants: Tenant[] }> {
    return this.call('gpuaas/api/tenants');
  }

  devices(): Promise<{ simulated: boolean; message?: string; devices: Device[] }> {
    return this.call('gpuaas/api/devices');
  }

  /** Right-sizing advice about my own work (`GET api/advice`). */
  advice(since = '30d'): Promise<AdviceAnswer> {
    return this.call<AdviceAnswer>(`gpuaas/api/advice?since=${encodeURIComponent(since)}`);
  }

  kernels(): Promise<GpuKernelInfo[]> {
    return this.call<GpuKernelInfo[]>('gpuaas/kernels');
  }

  cancelRequest(id: string): Promise<unknown> {
    return this.call(`gpuaas/api/requests/${encodeURIComponent(id)}`, { method: 'DELETE' });
  }

  /** Keep my GPU: the holder is reported busy once and its idle clock starts again. */
  keep(id: string): Promise<{ kept: boolean; message: string }> {
    return this.call(`gpuaas/sidebar/keep/${encodeURIComponent(id)}`, { method: 'POST' });
  }

  jobs(): Promise<Job[]> {
    return this.call<Job[]>('gpuaas/sidebar/jobs');
  }

  job(id: string): Promise<Job> {
    return this.call<Job>(`gpuaas/sidebar/jobs/${encodeURIComponent(id)}`);
  }

  submitJob(spec: Record<string, unknown>): Promise<Job> {
    return this.call<Job>('gpuaas/sidebar/jobs', {
      method: 'POST',
      body: JSON.stringify(spec)
    });
  }

  cancelJob(id: string): Promise<unknown> {
    return this.call(`gpuaas/jobs/${encodeURIComponent(id)}`, { method: 'DELETE' });
  }

  async logTail(id: string, bytes = 4000): Promise<string> {
    const url = this.url(`gpuaas/jobs/${encodeURIComponent(id)}/logs?tail=${bytes}`);
    const response = await ServerConnection.makeRequest(url, { cache: 'no-cache' }, this.settings);
    return response.ok ? response.text() : '';
  }

  /**
   * The URL of the events stream. EventSource sends the session cookie (same origin) but
   * no headers, so JupyterLab's XSRF token goes as the `_xsrf` parameter (what
   * ServerConnection sends as a header): behind JupyterHub a cookie-authenticated API
   * request without it is refused (403). Never a token in the URL.
   */
  eventsUrl(): string {
    const url = this.url('gpuaas/api/events');
    const match = document.cookie.match('\\b_xsrf=([^;]*)\\b');
    return match ? `${url}?_xsrf=${encodeURIComponent(match[1])}` : url;
  }
}
