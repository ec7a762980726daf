/** The types of CloseRace.mjs (plain JavaScript, so that an installed app can run it too). */
export declare const replayCloseRace: (
  postgres: (url: string, options: object) => unknown,
  databaseUrl: string,
  options?: { readonly rounds?: number }
) => Promise<Array<string>>
