/* Page-fault cost of fresh anonymous memory on this host: first touch by 4 KiB faults,
 * MADV_POPULATE_WRITE, and MADV_HUGEPAGE (bench/RESULTS_BENCH.md, 2026-11-24).
 *   cc -O2 -o /tmp/page_faults bench/page_faults.c && /tmp/page_faults 128 0|1|2   (MiB, mode) */
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  size_t n=(size_t)atol(argv[1])<<20; int mode=atoi(argv[2]);
  for(int rep=0;rep<3;rep++){
  char*p=mmap(NULL,n,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
  if(mode==2) madvise(p,n,MADV_HUGEPAGE);
  double t=now();
  if(mode==1){ int r=madvise(p,n,MADV_POPULATE_WRITE); if(r) perror("madvise"); }
  double t1=now();
  for(size_t i=0;i<n;i+=4096)p[i]=1;
  double t2=now();
  printf("mode %d: populate %.2f ms, touch %.2f ms (%.2f us/page)\n",mode,(t1-t)*1e3,(t2-t1)*1e3,(t2-t)*1e6/(n/4096));
  munmap(p,n);}
}
