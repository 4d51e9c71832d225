/* Standalone (not built by peers.sh): memcpy and non-temporal copy rates, and a two-thread
 * model of the two-copy ring pipeline (bench/results/large-pipeline.md).
 * Build: gcc -O2 -mavx512f -pthread memcpy_pipe.c -o memcpy_pipe
 * Run:   ./memcpy_pipe memcpy            (rates per size)
 *        ./memcpy_pipe MSG CHUNK RING [NT] (osu_bw pattern: windows of 64 messages)
 *        ./memcpy_pipe single MSG [NT]  (the shared-heap floor: core 1 copies a buffer core 0
 *                                        wrote into 64 distinct buffers, window after window)
 *        ./memcpy_pipe pingpong RING     (the two-copy latency floor: osu_latency's pattern,
 *                                        16 KiB-64 MiB, one-way us at the best chunk size)
 *        ./memcpy_pipe split MSG [NT]   (the split shared-heap floor: both cores copy half of
 *                                        each message into 64 distinct buffers, meeting at a
 *                                        barrier after each window) */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <immintrin.h>
static size_t MSG, CHUNK, RING, WIN = 64, ITERS;
static char *src, *dst, *ring;
static _Atomic size_t head, tail; static int nt;
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static void pin(int c){cpu_set_t s;CPU_ZERO(&s);CPU_SET(c,&s);sched_setaffinity(0,sizeof s,&s);}
static void ntcopy(char*d,const char*s,size_t n){for(size_t i=0;i<n;i+=64){__m512i v=_mm512_loadu_si512(s+i);_mm512_stream_si512((void*)(d+i),v);}_mm_sfence();}
/* A copy with non-temporal stores when NT was asked for, else memcpy. */
static void copy(char*d,const char*s,size_t n){if(nt)ntcopy(d,s,n);else memcpy(d,s,n);}
/* `single` and `split`: MSG and NT from the arguments, a window's worth of iterations. */
static void win_args(int c,char**v){MSG=atol(v[2]);nt=c>3?atoi(v[3]):0;ITERS=((size_t)4<<30)/(MSG*WIN);if(ITERS<3)ITERS=3;}
static void *prod(void*a){pin(0);size_t h=0;for(size_t it=0;it<ITERS;it++)for(size_t w=0;w<WIN;w++)for(size_t o=0;o<MSG;o+=CHUNK){size_t n=MSG-o<CHUNK?MSG-o:CHUNK;while(h+CHUNK-atomic_load_explicit(&tail,memory_order_acquire)>RING)_mm_pause();memcpy(ring+(h%RING),src+o,n);h+=CHUNK;atomic_store_explicit(&head,h,memory_order_release);}return 0;}
static void *cons(void*a){pin(1);size_t t=0;for(size_t it=0;it<ITERS;it++)for(size_t w=0;w<WIN;w++)for(size_t o=0;o<MSG;o+=CHUNK){size_t n=MSG-o<CHUNK?MSG-o:CHUNK;while(atomic_load_explicit(&head,memory_order_acquire)<t+CHUNK)_mm_pause();char*d=dst+w*MSG+o;if(nt&&n>=4096)ntcopy(d,ring+(t%RING),n);else memcpy(d,ring+(t%RING),n);t+=CHUNK;atomic_store_explicit(&tail,t,memory_order_release);}return 0;}
/* pingpong: rings a->b and b->a of RING bytes; each side copies its message in by CHUNKs
 * while the other copies them out as they land, then the other answers the same way. */
static char *pr[2], *ps[2], *pd[2]; static _Atomic size_t ph[2], pt[2];
static void psend(int r,const char*s,size_t n){size_t h=atomic_load_explicit(&ph[r],memory_order_relaxed);for(size_t o=0;o<n;o+=CHUNK){size_t k=n-o<CHUNK?n-o:CHUNK;while(h+CHUNK-atomic_load_explicit(&pt[r],memory_order_acquire)>RING)_mm_pause();memcpy(pr[r]+(h%RING),s+o,k);h+=CHUNK;atomic_store_explicit(&ph[r],h,memory_order_release);}}
static void precv(int r,char*d,size_t n){size_t t=atomic_load_explicit(&pt[r],memory_order_relaxed);for(size_t o=0;o<n;o+=CHUNK){size_t k=n-o<CHUNK?n-o:CHUNK;while(atomic_load_explicit(&ph[r],memory_order_acquire)<t+CHUNK)_mm_pause();memcpy(d+o,pr[r]+(t%RING),k);t+=CHUNK;atomic_store_explicit(&pt[r],t,memory_order_release);}}
static void *pside(void*a){int me=(int)(size_t)a;pin(me);for(size_t i=0;i<ITERS;i++){if(me==0){psend(0,ps[0],MSG);precv(1,pd[0],MSG);}else{precv(0,pd[1],MSG);psend(1,ps[1],MSG);}}return 0;}
static double pingpong(size_t msg,size_t chunk){MSG=msg;CHUNK=chunk;ITERS=(((size_t)2<<30)/msg)/4+4;if(ITERS>20000)ITERS=20000;double best=1e9;
 for(int rep=0;rep<3;rep++){for(int r=0;r<2;r++){ph[r]=pt[r]=0;}pthread_t a,b;double t0=now();pthread_create(&a,0,pside,(void*)0);pthread_create(&b,0,pside,(void*)1);pthread_join(a,0);pthread_join(b,0);double t=(now()-t0)/ITERS/2;if(t<best)best=t;}return best;}
/* split: thread `me` copies its half of each message of a window, then waits for the other. */
static pthread_barrier_t bar;
static void *half(void*a){int me=(int)(size_t)a;pin(me);size_t h=(MSG/2)&~(size_t)4095,o=me?h:0,n=me?MSG-h:h;
 for(size_t it=0;it<ITERS;it++){for(size_t w=0;w<WIN;w++)copy(dst+w*MSG+o,src+o,n);pthread_barrier_wait(&bar);}return 0;}
int main(int c,char**v){
 if(c>2&&!strcmp(v[1],"pingpong")){RING=atol(v[2]);for(int r=0;r<2;r++){pr[r]=aligned_alloc(4096,RING);memset(pr[r],0,RING);ps[r]=aligned_alloc(4096,64u<<20);pd[r]=aligned_alloc(4096,64u<<20);memset(ps[r],1,64u<<20);memset(pd[r],2,64u<<20);}
  for(size_t m=16384;m<=(64u<<20);m*=2){double best=1e9;size_t bc=0;for(size_t ch=8192;ch<=RING/2&&ch<=m;ch*=2){double t=pingpong(m,ch);if(t<best){best=t;bc=ch;}}
   printf("%9zu one-way %9.2f us (%5.1f GB/s), chunk %zu\n",m,best*1e6,m/best/1e9,bc);fflush(stdout);}return 0;}
 if(c>1&&!strcmp(v[1],"memcpy")){ /* memcpy GB/s, hot */
  for(size_t s=16384;s<=(64u<<20);s*=2){char*a=aligned_alloc(4096,s),*b=aligned_alloc(4096,s);memset(a,1,s);memset(b,2,s);size_t it=(1u<<31)/s+2;double best=1e9;for(int r=0;r<5;r++){double t0=now();for(size_t i=0;i<it;i++)memcpy(b,a,s);double t=(now()-t0)/it;if(t<best)best=t;}
  double bn=1e9;for(int r=0;r<3;r++){double t0=now();for(size_t i=0;i<it;i++)ntcopy(b,a,s);double t=(now()-t0)/it;if(t<bn)bn=t;}
  printf("%9zu memcpy %6.1f GB/s  nt %6.1f GB/s\n",s,s/best/1e9,s/bn/1e9);free(a);free(b);}return 0;}
 if(c>2&&!strcmp(v[1],"split")){ /* both cores copy half of every message, window by window */
  win_args(c,v);
  src=aligned_alloc(4096,MSG);dst=aligned_alloc(4096,MSG*WIN);memset(src,1,MSG);memset(dst,2,MSG*WIN);
  pthread_barrier_init(&bar,0,2);pthread_t a,b;double t0=now();pthread_create(&a,0,half,(void*)0);pthread_create(&b,0,half,(void*)1);
  pthread_join(a,0);pthread_join(b,0);double t=now()-t0;printf("split msg %zu nt %d: %.1f GB/s\n",MSG,nt,(double)MSG*WIN*ITERS/t/1e9);return 0;}
 if(c>2&&!strcmp(v[1],"single")){ /* one memcpy per message, source written by the other core */
  win_args(c,v);
  src=aligned_alloc(4096,MSG);dst=aligned_alloc(4096,MSG*WIN);pin(0);memset(src,1,MSG);memset(dst,2,MSG*WIN);pin(1);
  double t0=now();for(size_t it=0;it<ITERS;it++)for(size_t w=0;w<WIN;w++)copy(dst+w*MSG,src,MSG);
  double t=now()-t0;printf("single msg %zu nt %d: %.1f GB/s\n",MSG,nt,(double)MSG*WIN*ITERS/t/1e9);return 0;}
 MSG=atol(v[1]);CHUNK=atol(v[2]);RING=atol(v[3]);nt=c>4?atoi(v[4]):0;
 size_t tot=(size_t)4<<30; ITERS=tot/(MSG*WIN); if(ITERS<3)ITERS=3;
 src=aligned_alloc(4096,MSG);dst=aligned_alloc(4096,MSG*WIN);ring=aligned_alloc(4096,RING);memset(src,1,MSG);memset(dst,2,MSG*WIN);memset(ring,0,RING);
 pthread_t a,b;double t0=now();pthread_create(&a,0,prod,0);pthread_create(&b,0,cons,0);pthread_join(a,0);pthread_join(b,0);double t=now()-t0;
 printf("msg %zu chunk %zu ring %zu nt %d: %.1f GB/s\n",MSG,CHUNK,RING,nt,(double)MSG*WIN*ITERS/t/1e9);}
